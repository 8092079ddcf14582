"""Faults injected into a real run, in whichever process the part lives (importable as
`faults`; the fault matrix, tests/runs/test_fault_matrix.py, uses them):

- `FullDiskActor`: the actor, whose disk fills at its second checkpoint. The mechanism of
  tests/runs/test_checkpoint_disk_full.py (a write that raises OSError ENOSPC inside
  `atomic_dir`, after the files are written), applied inside `save_checkpoint`, so it runs
  in the driver's process (in-process, one_step_off) and in a Ray rank's (data parallel).
"""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path
from typing import Any

import baton.models.load as model_load
from baton.controller.dispatch import SPEC_ATTR
from baton.workers.actor import ActorWorker


@contextlib.contextmanager
def full_disk():
    """Within the block, a checkpoint write (`save_pretrained`'s `atomic_dir`) fails with
    ENOSPC once its files are written, as a disk that filled on the last byte does."""
    real = model_load.atomic_dir

    @contextlib.contextmanager
    def filling(final: Any, *args: Any, **kwargs: Any):
        with real(final, *args, **kwargs) as tmp:
            yield tmp
            raise OSError(errno.ENOSPC, "No space left on device", str(Path(tmp) / "model.safetensors"))

    model_load.atomic_dir = filling
    try:
        yield
    finally:
        model_load.atomic_dir = real


class FullDiskActor(ActorWorker):
    """An ActorWorker whose second checkpoint finds the disk full."""

    def save_checkpoint(self, path: str, driver_state: dict[str, Any]) -> str:
        self.saves = getattr(self, "saves", 0) + 1
        if self.saves < 2:
            return super().save_checkpoint(path, driver_state)
        with full_disk():
            return super().save_checkpoint(path, driver_state)

    setattr(save_checkpoint, SPEC_ATTR, getattr(ActorWorker.save_checkpoint, SPEC_ATTR))  # driver-callable as the base's

