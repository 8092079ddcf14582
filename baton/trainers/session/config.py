"""Config sections every driver shares: where prompts come from (`data:`) and how the run
is driven, logged, saved and resumed (`trainer:`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from baton.envs import TASKS, configured_task, get_task
from baton.metrics import SINKS, check_sinks
from baton.sources import data_sources, source_reads, unread_keys
from baton.user_modules import is_spec


def check_task(name: str, args: dict[str, Any] | None = None) -> None:
    """`data.task` names a built-in task or a user's `module:Class` that imports as a Task,
    and `data.task_args` configure it (one-line ValueError otherwise, a missing extra's
    naming its pip command): what every driver's `data.task` accepts."""
    if name not in TASKS and is_spec(name):
        get_task(name)  # a user's module:Class: importable and a Task, or a one-line error
    elif name not in TASKS:
        raise ValueError(f"data.task={name!r} is not one of {sorted(TASKS)} (or a user task module:Class)")
    configured_task(name, args)  # the task's configure() checks its arguments (and imports its extra)


@dataclass
class DataConfig:
    task: str = "arithmetic"  # a name in baton.envs.TASKS
    task_args: dict[str, Any] = field(default_factory=dict)  # the task's configure(**task_args) (reasoning_gym)
    prompts_per_step: int = 16
    eval_size: int = 200  # held-out prompts for evaluation
    seed: int = 0
    path: str = ""  # rows from a local jsonl / parquet file instead of the task's (docs/OWN_DATA.md: row shapes)
    eval_path: str = ""  # held-out rows from a file ("" = every 10th row of `path`, or the task's split)
    # Where a step's rows come from: "rollout" (this run's rollout role), "api" (batches
    # pulled from `baton api`, fed by `baton env` services; sources/api.py) or "agent"
    # (multi-turn episodes with tools on the rollout role, colocated or a generator running
    # ahead: the `agent:` section, sources/episodes.py) or "gateway" (an OpenAI-speaking
    # agent's sessions through a gateway on the rollout engine: the `gateway:` section).
    source: str = "rollout"
    api_url: str = "http://127.0.0.1:8000"  # data.source=api: the trajectory API (token: env BATON_API_TOKEN)
    servers: list[str] = field(default_factory=list)  # `baton serve` URLs kept on the trainer's weights
    sync_every: int = 1  # push weights to the servers every K steps
    weights_dir: str = ""  # sync=checkpoint: where the weight files go (the servers' --weights-dir)
    api_wait_s: float = 0.0  # give up when no batch comes for this long (0: wait for ever, saying why)
    envs: list[str] = field(default_factory=list)  # what `baton launch` starts: "NAME [baton env options]"

    def check(self) -> None:
        check_task(self.task, self.task_args)
        if self.prompts_per_step < 1 or self.eval_size < 1:
            raise ValueError(f"data.prompts_per_step and data.eval_size must be >= 1 "
                             f"(got {self.prompts_per_step}, {self.eval_size})")
        if self.eval_path and not self.path:
            raise ValueError("data.eval_path is read only with data.path (a task's held-out rows are its own)")
        if self.task == "gsm8k" and not self.path:
            raise ValueError("data.task=gsm8k reads its rows from a local file: set data.path (GSM8K jsonl or "
                             "verl parquet)")
        if self.source not in data_sources():  # what the registered row sources read (baton.sources)
            raise ValueError(f"data.source={self.source!r} is not one of {data_sources()}")
        if self.sync_every < 1 or self.api_wait_s < 0:
            raise ValueError(f"data.sync_every must be >= 1 and data.api_wait_s >= 0 "
                             f"(got {self.sync_every}, {self.api_wait_s})")
        defaults = DataConfig()
        for key, readers in unread_keys(self.source, lambda k: k.startswith("data.") and
                                        getattr(self, k[5:], None) != getattr(defaults, k[5:], None)):
            raise ValueError(f"{key} is read only with data.source={'/'.join(readers)} (this run's rows come from "
                             f"data.source={self.source}): remove it, or set data.source={readers[0]}")
        bad = [u for u in [self.api_url, *self.servers] if not u.startswith(("http://", "https://"))]
        if bad and "data.api_url" in source_reads(self.source):
            raise ValueError(f"data.api_url / data.servers must be http(s) URLs, got {bad[0]!r}")


@dataclass
class TrainerConfig:
    steps: int = 100
    run_dir: str = "runs/grpo"
    seed: int = 0
    eval_every: int = 0  # steps between held-out evaluations (0 = start and end only)
    save_every: int = 0  # steps between checkpoints (0 = only at the end)
    resume: str = ""  # "" = fresh, "auto" = latest complete checkpoint in run_dir, or a checkpoint path
    overwrite: bool = False  # start fresh in a run dir that holds a run (baton's files there are removed)
    resume_changes: Literal["refuse", "allow"] = "refuse"  # resume with a config that differs from the run's
    keep_checkpoints: int = 0  # keep the last K checkpoints (0 = all)
    max_nonfinite_steps: int = 3  # stop after this many steps with a non-finite loss/gradient
    sinks: list[str] = field(default_factory=list)  # extra metric sinks: tensorboard, wandb, mlflow (docs/LOGGING.md)
    progress: bool = True

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
        check_sinks(self.sinks)


@dataclass
class RolloutTrainerConfig(TrainerConfig):
    """The `trainer:` section of a run that samples with a rollout engine (online DPO; the
    PPO family extends it): TrainerConfig plus the weight-sync parity check."""
    check_weight_sync: bool = False  # after each sync, engine logprobs = trainer logprobs on a probe, or stop
