"""Config sections every driver shares: where prompts come from (`data:`) and how the run
is driven, logged, saved and resumed (`trainer:`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from baton.envs import TASKS
from baton.metrics import SINKS


@dataclass
class DataConfig:
    task: str = "arithmetic"  # a name in baton.envs.TASKS
    prompts_per_step: int = 16
    eval_size: int = 200  # held-out prompts for evaluation
    seed: int = 0

    def check(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"data.task={self.task!r} is not one of {sorted(TASKS)}")
        if self.prompts_per_step < 1 or self.eval_size < 1:
            raise ValueError(f"data.prompts_per_step and data.eval_size must be >= 1 "
                             f"(got {self.prompts_per_step}, {self.eval_size})")


@dataclass
class TrainerConfig:
    steps: int = 100
    run_dir: str = "runs/grpo"
    seed: int = 0
    eval_every: int = 0  # steps between held-out evaluations (0 = start and end only)
    save_every: int = 0  # steps between checkpoints (0 = only at the end)
    resume: str = ""  # "" = fresh, "auto" = latest complete checkpoint in run_dir, or a checkpoint path
    overwrite: bool = False  # start fresh in a run dir that holds a run (baton's files there are removed)
    keep_checkpoints: int = 0  # keep the last K checkpoints (0 = all)
    max_nonfinite_steps: int = 3  # stop after this many steps with a non-finite loss/gradient
    sinks: list[str] = field(default_factory=list)  # extra metric sinks: tensorboard, wandb
    progress: bool = True
    check_weight_sync: bool = False  # assert engine/trainer logprob parity after each sync

    def check(self) -> None:
        if self.steps < 1:
            raise ValueError(f"trainer.steps must be >= 1, got {self.steps}")
        if self.eval_every < 0 or self.save_every < 0 or self.keep_checkpoints < 0:
            raise ValueError("trainer.eval_every, trainer.save_every and trainer.keep_checkpoints must be >= 0")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"trainer.max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        if self.overwrite and self.resume:
            raise ValueError("trainer.overwrite=true and trainer.resume both set: choose one")
        bad = [s for s in self.sinks if s not in SINKS]
        if bad:
            raise ValueError(f"trainer.sinks: {bad[0]!r} is not one of {list(SINKS)}")
