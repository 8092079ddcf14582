"""Where tensors cross devices: the one boundary of a worker call.

A worker receives the driver's `Batch` arguments, moves them to its device once
(`to_worker`), works there, and its results go back on the CPU (`to_driver`), so that
algorithms and drivers never see a device mismatch and no step moves the same data back and
forth. On a CPU worker both are the identity (the same objects, not copies): the CPU path is
bit for bit what it was before this boundary existed.

Only `Batch` arguments move (top-level positional and keyword arguments); configs, lists
and scalars are left as they are. Results: a `Batch`, a tensor, or a list / tuple / dict of
them (a metrics dict holds floats, which pass through). `enable_tf32`: what a slot on a GPU
turns on when it sets up its device.
"""

from __future__ import annotations

from typing import Any

import torch

from baton.batch import Batch


def to_worker(args: tuple, kwargs: dict, device: torch.device | None) -> tuple[tuple, dict]:
    """`args` / `kwargs` with every `Batch` on `device` (the CPU or None: unchanged)."""
    if device is None or device.type == "cpu":
        return args, kwargs

    def move(v: Any) -> Any:
        return v.to(device, non_blocking=True) if isinstance(v, Batch) else v

    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def to_driver(value: Any, device: torch.device | None) -> Any:
    """The result `value` of a worker on `device`, with every tensor on the CPU (recursing
    into Batch, list, tuple, dict). A CPU worker's result is returned as it is."""
    if device is None or device.type == "cpu":
        return value
    return _cpu(value)


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "cpu" else value.cpu()
    if isinstance(value, Batch):
        if all(t.device.type == "cpu" for t in value.tensors.values()):
            return value
        return value.to("cpu")
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):  # not a namedtuple
        return type(value)(_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    return value


def enable_tf32(device: torch.device) -> None:
    """TF32 for fp32 matmuls and convolutions on CUDA (Ampere and later); nothing on the CPU,
    whose fp32 numerics stay exact. Untested here: the CI machine has no GPU (tests/gpu/)."""
    if device.type != "cuda":
        return
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9
        matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
