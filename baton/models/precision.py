"""Precision and device defaults of the roles (docs/ARCHITECTURE.md, "Precision and devices").

On a GPU: fp32 master weights and optimizer state, bf16 autocast for the forward and
backward, TF32 for whatever matmuls stay fp32 (`baton.controller.devices.enable_tf32`, set
where a slot's CUDA device is set up); logprobs and losses are accumulated in fp32
(`baton.algos.linear_logprobs`, `upcast`). On the CPU: fp32 throughout (bf16 autocast on a
CPU without bf16 units is slower, and fp32 keeps the CPU runs bit for bit reproducible).
A role's `bf16` key is `None` by default, meaning "yes on CUDA, no elsewhere"; an explicit
true / false wins.

Peak memory per phase (`memory_phase("rollout")`, `memory_metrics()`): CUDA only, a no-op
elsewhere; the phases of one process (colocated roles) are reported together by the actor's
update as `memory/peak_gib_<phase>`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_PEAKS: dict[str, float] = {}  # phase -> peak GiB since the last memory_metrics()


def pick_device(name: str) -> torch.device:
    """A device setting made concrete: "auto" -> cuda (the current GPU) when CUDA is
    available, else cpu; "cpu" / "cuda" / "cuda:N" as given."""
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(name)


def resolve_bf16(flag: bool | None, device: torch.device | str) -> bool:
    """A role's `bf16` setting made concrete: None -> True on CUDA, False elsewhere."""
    if flag is not None:
        return bool(flag)
    return torch.device(device).type == "cuda"


def compute_dtype(bf16: bool) -> torch.dtype | None:
    """The dtype a role computes in under autocast (None: its weights' own)."""
    return torch.bfloat16 if bf16 else None


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on `device`'s type (a no-op context when not enabled)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


@contextlib.contextmanager
def memory_phase(name: str, device: torch.device) -> Iterator[None]:
    """Record the peak CUDA memory allocated while the block runs as phase `name` (the peak
    counter is reset on entry). CPU: nothing is recorded."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.reset_peak_memory_stats(device)
    try:
        yield
    finally:
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        _PEAKS[name] = max(peak, _PEAKS.get(name, 0.0))


def memory_metrics() -> dict[str, float]:
    """{memory/peak_gib_<phase>: GiB} recorded in this process since the last call (emptied)."""
    out = {f"memory/peak_gib_{k}": v for k, v in _PEAKS.items()}
    _PEAKS.clear()
    return out
