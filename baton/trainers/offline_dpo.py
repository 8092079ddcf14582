"""The offline DPO driver: preference pairs from a jsonl file, the same loss, config pieces,
metrics and checkpoints as online DPO.

    baton train recipes/offline_dpo_arithmetic.yaml data.path=pairs.jsonl [k=v ...]

Data: one JSON object per line, {"prompt": str, "chosen": str, "rejected": str}, tokenized
as the rollout engine tokenizes (baton.sources.pairs says how).

One step, top to bottom:
    pairs (next data.pairs_per_step rows of the seeded, resumable sampler; the row source
    "pairs", baton.sources.pairs) --encode_pairs-->
    pair-major rows --reference.compute_ref_logprobs--> reference logprobs
                    --actor.update_dpo--> new weights, rewards/*, logps/*, dpo/kl
Evaluation (trainer.eval_every, and at the start and the end): the same metrics on
`data.eval_path`'s pairs without a step (eval/rewards/accuracies, ...), and, with
`data.task`, held-out generation accuracy through a rollout engine colocated with the actor.

Logprobs are at temperature 1 (the model's own distribution). Departure from the DPO paper
(Rafailov et al. 2023): none in the loss; `dpo.ref_refresh_every` (iterative DPO) is
available here too.
"""

from __future__ import annotations

from baton.batch import collate
from baton.data.prompts import PromptSampler
from baton.envs import get_task
from baton.sources import row_source
from baton.sources.colocated import evaluate_rollout
from baton.data.records import identical_pairs, load_pairs
from baton.sources.pairs import encode_pairs
from baton.trainers.dpo_config import OfflineDPOConfig
from baton.trainers.dpo_roles import (build_dpo_roles, maybe_refresh_reference, reference_state,
                                      restore_reference, with_ref_logprobs)
from baton.trainers.session.run import RunSession, save_checkpoint
from baton.trainers.session.state import RunState


def train(cfg: OfflineDPOConfig) -> dict[str, float]:
    d = cfg.dpo
    with RunSession(cfg) as run:
        train_pairs = load_pairs(cfg.data.path)  # pairs with chosen == rejected left out, counted:
        identical = len(identical_pairs(cfg.data.path))  # data/identical_pairs in each step's metrics
        eval_text = collate(load_pairs(cfg.data.eval_path)) if cfg.data.eval_path else None  # a bad file fails here
        task_rows = get_task(cfg.data.task).eval_rows(cfg.data.eval_size) if cfg.data.task else []
        state = RunState(sampler=PromptSampler(train_pairs, seed=cfg.data.seed), eval_rows=task_rows)
        run.roles = roles = build_dpo_roles(
            cfg, temperature=1.0, task=cfg.data.task,
            probe_prompt=task_rows[0]["prompt"] if task_rows else train_pairs[0]["prompt"])
        actor, ref, rollout = roles["actor"], roles.get("reference"), roles.get("rollout")
        source = row_source(cfg, roles, state, name="pairs")  # a PairFileSource: its tokenizer encodes eval pairs
        eval_pairs = (encode_pairs(source.tokenizer, eval_text, cfg.placement.world_size)
                      if eval_text is not None else None)

        def evaluation() -> dict[str, float]:
            out = evaluate_rollout(rollout, state.eval_rows) if rollout is not None else {}
            if eval_pairs is not None:
                out.update(actor.evaluate_dpo(with_ref_logprobs(ref, eval_pairs))[0])
            return out

        def restore(path: str) -> None:
            saved = actor.load_checkpoint(path)[0]
            state.restore(saved)
            restore_reference(roles, saved)
            source.weights_updated(state.step)

        run.start(state, restore=restore, evaluate=evaluation)
        for step, timed in run.steps():
            batch = source.rows(step)
            with timed("reference"):
                batch = with_ref_logprobs(ref, batch)
            with timed("update"):  # skips optimizer steps whose loss/grad is not finite
                metrics = {**actor.update_dpo(batch)[0], "dpo/pairs": cfg.data.pairs_per_step,
                           "data/identical_pairs": identical}
            source.weights_updated(step)
            metrics["dpo/ref_refreshed"] = int(maybe_refresh_reference(roles, d.ref_refresh_every, step))
            run.end_step(step, metrics, save=lambda: save_checkpoint(
                actor, run.run, run.t, step, {**state.to_dict(), **reference_state(roles, d.ref_refresh_every, step)}))
    return run.result()
