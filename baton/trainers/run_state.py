"""What the driver of a run owns between steps, and how it is saved and restored.

The step counter, the prompt sampler's position (so a resumed run sees the same data order),
the held-out rows, and the first evaluation. Saved inside each checkpoint next to the
actor's weights and optimizer (see ActorWorker.save_checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from baton.batch import Batch, collate
from baton.data.prompts import PromptSampler
from baton.envs import get_task
from baton.trainers.run_config import DataConfig


@dataclass
class RunState:
    sampler: PromptSampler
    eval_rows: list[dict[str, Any]]
    step: int = 0
    first_eval: dict[str, float] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)  # the row source's own state (sources.py)

    @classmethod
    def fresh(cls, data: DataConfig) -> "RunState":
        task = get_task(data.task)
        return cls(sampler=PromptSampler(task.train_rows(seed=data.seed), seed=data.seed),
                   eval_rows=task.eval_rows(data.eval_size))

    def next_prompts(self, n: int) -> Batch:
        return collate(self.sampler.next_batch(n))

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sampler": self.sampler.state_dict(), "first_eval": self.first_eval,
                "source": self.source}

    def restore(self, saved: dict[str, Any]) -> None:
        self.step = saved["step"]
        self.sampler.load_state_dict(saved["sampler"])
        self.first_eval = saved.get("first_eval", {})
        self.source = saved.get("source", {})

