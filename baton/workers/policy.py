"""`Policy`: the actor's explicit handle to the policy it trains.

A colocated rollout engine receives this handle (module + tokenizer + version) instead of
reaching into the actor's attributes. `in_place`: the engine may read the module's
parameters as they are (ddp without tensor parallelism: no copy at all); otherwise they are
sharded DTensors (fsdp2, tp) and the engine keeps its own plain copy, refilled from
`named_weights()` (full tensors gathered one at a time; a collective every rank runs) at
each sync. `version` counts the optimizer-step rounds the module has taken (the policy
version every sampled row carries). `compute_dtype`: the dtype the trainer computes in
(bf16 under autocast on a GPU, `baton.models.precision`; None: the weights' own), the one a
colocated engine samples in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch


@dataclass
class Policy:
    module: torch.nn.Module
    tokenizer: Any
    version: int = 0
    in_place: bool = True
    full_weights: Callable[[], Iterator[tuple[str, torch.Tensor]]] | None = None
    compute_dtype: torch.dtype | None = None

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of every parameter: gathered when sharded, else the module's."""
        if self.full_weights is not None:
            return self.full_weights()
        return iter(self.module.named_parameters())
