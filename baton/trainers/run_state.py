"""What the driver of a run owns between steps, and how it is saved and restored.

The step counter, the prompt sampler's position (so a resumed run sees the same data order),
the held-out rows, and the first evaluation. Saved inside each checkpoint next to the
actor's weights and optimizer (see ActorWorker.save_checkpoint).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
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

    @classmethod
    def fresh(cls, data: DataConfig) -> "RunState":
        task = get_task(data.task)
        return cls(sampler=PromptSampler(task.train_rows(seed=data.seed), seed=data.seed),
                   eval_rows=task.eval_rows(data.eval_size))

    def next_prompts(self, n: int) -> Batch:
        return collate(self.sampler.next_batch(n))

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sampler": self.sampler.state_dict(), "first_eval": self.first_eval}

    def restore(self, saved: dict[str, Any]) -> None:
        self.step = saved["step"]
        self.sampler.load_state_dict(saved["sampler"])
        self.first_eval = saved.get("first_eval", {})


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The highest `checkpoints/step_N` in run_dir (temp dirs of interrupted saves are ignored)."""
    found = [(int(m.group(1)), p) for p in (run_dir / "checkpoints").glob("step_*")
             if (m := re.fullmatch(r"step_(\d+)", p.name)) and p.is_dir()]
    return max(found)[1] if found else None
