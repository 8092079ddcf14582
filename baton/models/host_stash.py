"""Host copies of device tensors in buffers allocated once and reused: where the optimizer
state goes between phases (`baton.models.parallel.move_optimizer_state`, `actor.offload`).

Before issue 43 each offload made a pageable host copy, then a pinned copy of that
(`t.to("cpu").pin_memory()`): two copies and two allocations per state tensor per update.
`HostStash.to_host(key, t)` copies `t` once, straight into a host buffer kept under `key`
(allocated on the first offload, page-locked where CUDA is available, so the copy is an
asynchronous DMA, `non_blocking`), and the next offload of the same key reuses it. The
caller synchronizes before the host reads the buffers (`move_optimizer_state` does).

Page-locked memory needs CUDA: without it (a CPU-only machine or build) the buffers are
plain host memory and the copies blocking, which the tests exercise; `host_empty` is the
one CUDA-only call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor


def can_pin() -> bool:
    """Whether page-locked host memory can be had (CUDA available)."""
    return torch.cuda.is_available()


def host_empty(like: torch.Tensor, pinned: bool) -> torch.Tensor:
    """An uninitialised CPU tensor of `like`'s shape and dtype, page-locked when `pinned`
    (CUDA only: `pin_memory=True` fails without it)."""
    return torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=pinned)


class HostStash:
    """Host buffers by key. pinned: page-locked buffers and asynchronous copies (None: where
    CUDA is available). `allocations` counts the buffers ever allocated."""

    def __init__(self, pinned: bool | None = None):
        self.pinned = can_pin() if pinned is None else pinned
        self.buffers: dict[Any, torch.Tensor] = {}
        self.allocations = 0

    def to_host(self, key: Any, t: torch.Tensor) -> torch.Tensor:
        """`t`'s values in the host buffer of `key` (one copy; a DTensor: its local shard,
        returned as a DTensor with the same mesh and placements). The buffer is allocated
        the first time, and again only if `t`'s shape or dtype changed."""
        local = t.to_local() if isinstance(t, DTensor) else t
        buf = self.buffers.get(key)
        if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
            buf = self.buffers[key] = host_empty(local, self.pinned)
            self.allocations += 1
        buf.copy_(local, non_blocking=self.pinned)
        if local is t:
            return buf
        return DTensor.from_local(buf, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
