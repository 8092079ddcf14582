"""Weight sync into an in-process engine that holds its own copy of the weights.

Used when the trainer's parameters cannot be read in place (sharded: fsdp2 or tensor
parallel DTensors): the engine keeps a plain module, and a push copies the full tensors
into it one at a time, as the iterator yields them (e.g. gathered layer by layer from the
shards), so no second full copy exists beyond the engine's own.
"""

from __future__ import annotations

import time
from typing import Iterable, Iterator

import torch



class CopySync:
    def __init__(self, engines):
        self.engines = list(engines) if isinstance(engines, (list, tuple)) else [engines]
        self.last: dict[str, float] = {}
        if len(self.engines) != 1:
            raise ValueError("CopySync streams one iterator into one engine; use one sync per engine")

    def push(self, named_params: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Every tensor copied in as it comes (no delta: hashing to find what changed costs
        more than this copy); `last`: sync/bytes, sync/seconds, sync/tensors."""
        t0, moved = time.perf_counter(), [0, 0]

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for name, t in named_params:
                moved[0] += t.numel() * t.element_size()
                moved[1] += 1
                yield name, t
        self.engines[0].update_weights(counted(), version)
        self.last = {"sync/bytes": float(moved[0]), "sync/seconds": time.perf_counter() - t0,
                     "sync/tensors": float(moved[1])}

    def close(self) -> None:
        pass
