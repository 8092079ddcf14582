"""Weight sync into an in-process engine that holds its own copy of the weights.

Used when the trainer's parameters cannot be read in place (sharded: fsdp2 or tensor
parallel DTensors): the engine keeps a plain module, and a push copies the full tensors
into it one at a time, as the iterator yields them (e.g. gathered layer by layer from the
shards), so no second full copy exists beyond the engine's own.
"""

from __future__ import annotations

from typing import Iterable

import torch



class CopySync:
    def __init__(self, engines):
        self.engines = list(engines) if isinstance(engines, (list, tuple)) else [engines]
        if len(self.engines) != 1:
            raise ValueError("CopySync streams one iterator into one engine; use one sync per engine")

    def push(self, named_params: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.engines[0].update_weights(named_params, version)

    def close(self) -> None:
        pass
