"""What a PPO-family step shows about its learning signal, in one call from the driver:
`reward/tied_group_frac` (and one warning when most groups tie: `tied_groups.py`) and a few
of its completions in the run dir's samples.jsonl at step 1 and each evaluation (`samples.py`).

    watch = StepSignal(cfg)
    metrics.update(watch.check(step, batch, group_index))   # batch scored (F.REWARDS)
"""

from __future__ import annotations

from typing import Any

import torch

from baton import fields as F
from baton.batch import Batch
from baton.trainers.report.samples import SampleLog
from baton.trainers.report.tied_groups import TiedGroups


class StepSignal:
    def __init__(self, cfg: Any) -> None:
        t = cfg.trainer
        self.tied = TiedGroups(cfg)
        self.samples = SampleLog(t.run_dir, t.eval_every, t.steps)

    def check(self, step: int, batch: Batch, group_index: torch.Tensor) -> dict[str, float]:
        self.samples.write(step, batch, group_index)
        return self.tied.check(step, batch[F.REWARDS], group_index)
