"""What the driver of a run owns between steps, and how it is saved and restored.

The step counter, the prompt sampler's position (so a resumed run sees the same data order),
the held-out rows, the first evaluation, and the ledger of what each step trained
(`baton.trainers.session.ledger`). Saved inside each checkpoint next to the
actor's weights and optimizer (see ActorWorker.save_checkpoint).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from baton.batch import Batch, collate
from baton.data.prompts import PromptSampler
from baton.data.records import load_rows
from baton.envs import configured_task, get_task
from baton.envs.base import row_fields
from baton.runs.rundir import RunDirError
from baton.trainers.session.config import DataConfig


@dataclass
class RunState:
    sampler: PromptSampler
    eval_rows: list[dict[str, Any]]
    step: int = 0
    first_eval: dict[str, float] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)  # the row source's own state (sources.py)
    ledger: list[dict[str, Any]] = field(default_factory=list)  # what each step trained (ledger.py)

    @classmethod
    def fresh(cls, data: DataConfig) -> "RunState":
        train, held = task_rows(data)
        return cls(sampler=PromptSampler(train, seed=data.seed), eval_rows=held)

    def next_prompts(self, n: int) -> Batch:
        return collate(self.sampler.next_batch(n))

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sampler": self.sampler.state_dict(), "first_eval": self.first_eval,
                "source": self.source, "ledger": self.ledger}

    def restore(self, saved: dict[str, Any]) -> None:
        self.step = saved["step"]
        try:
            self.sampler.load_state_dict(saved["sampler"])
        except ValueError:  # the data file has another number of rows than the checkpoint's sampler saw
            raise RunDirError(f"cannot resume at step {self.step}: the data changed since the checkpoint (it drew "
                              f"from {saved['sampler'].get('size')} training rows, there are {len(self.sampler)} now); "
                              f"put the data file back, or start the run over (trainer.overwrite=true)") from None
        self.first_eval = saved.get("first_eval", {})
        self.source = saved.get("source", {})
        self.ledger = list(saved.get("ledger", []))


HOLD_EVERY = 10  # without data.eval_path, every 10th row of data.path (the first included) is held out


def is_file_task(name: str) -> bool:
    """Whether the task reads data.path with a loader of its own (gsm8k: `path`, `eval_path`)."""
    task = get_task(name)
    return hasattr(task, "path") and hasattr(task, "eval_path")


def task_rows(data: DataConfig, target_field: str = "") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, held-out rows) of `data.task`, or of the local file `data.path` (jsonl /
    parquet in baton's, GSM8K's or verl's shape, `baton.data.records`; chat-message prompts are
    rendered with the tokenizer's template when sampled). A file-backed task (gsm8k) reads it
    with its own loader; any other task's verifier scores the file's rows. Held out:
    `data.eval_path`'s rows, else every 10th row of the file (never trained on). Each row
    needs the fields the task scores against (`row_fields`: a one-line DataError naming the
    row otherwise); `target_field` (SFT's "target") stands in for them in `data.path`'s rows."""
    task = configured_task(data.task, data.task_args)
    if not data.path:
        return task.train_rows(seed=data.seed), task.eval_rows(data.eval_size)
    if is_file_task(data.task):
        task = dataclasses.replace(task, path=data.path, eval_path=data.eval_path)
        return task.train_rows(seed=data.seed), task.eval_rows(data.eval_size)
    need = row_fields(task)
    rows = load_rows(data.path, require=tuple(f"{f}|{target_field}" for f in need) if target_field else need)
    if data.eval_path:
        return rows, load_rows(data.eval_path, require=need, key="data.eval_path")[:data.eval_size]
    return [r for i, r in enumerate(rows) if i % HOLD_EVERY], rows[::HOLD_EVERY][:data.eval_size]
