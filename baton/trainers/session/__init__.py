"""The run session every driver runs inside, written once: open, lock, resume, log, evaluate,
end of step, checkpoint, close, report.

    run.py         `RunSession`: the session; held-out evaluation when due, non-finite guards
    config.py      the sections every driver shares: `data:` (`DataConfig`) and `trainer:`
                   (`TrainerConfig`, `RolloutTrainerConfig`): what the session reads
    state.py       `RunState`: what a driver owns between steps (the prompt sampler, the step),
                   saved and restored with each checkpoint
    in_process.py  one model trained in the driver's own process (SFT, reward models)
    timeline.py    which role ran which call when (`timeline.jsonl`, split placement)
    ledger.py      which prompts (API groups) each step trained, kept in every checkpoint;
                   `baton ledger RUN_DIR [OTHER]` prints and compares it
"""
