"""Colocated weight sync: the engine reads the trainer's own module, so nothing is copied.

The trainer and the `EmbeddedEngine` share one `nn.Module`; after an optimizer step the
next `generate` already uses the new weights (the engine re-packs from the live
parameters on every call). A push therefore only tags the engines with the new version,
so completions report which policy produced them.
"""

from __future__ import annotations

from typing import Iterable

import torch



class InplaceSync:
    def __init__(self, engines):
        self.engines = list(engines) if isinstance(engines, (list, tuple)) else [engines]
        self.last: dict[str, float] = {}

    def push(self, named_params: Iterable[tuple[str, torch.Tensor]] | None, version: int) -> None:
        # named_params is deliberately not iterated: the engine's module *is* the trainer's.
        for engine in self.engines:
            engine.version = version
        self.last = {"sync/bytes": 0.0, "sync/seconds": 0.0, "sync/tensors": 0.0}  # nothing moves

    def close(self) -> None:
        pass
