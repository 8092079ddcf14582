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
    """`args` / `kwargs` with every `Batch` on `device` (the host or None: unchanged)."""
    if is_host(device):
        return args, kwargs

    def move(v: Any) -> Any:
        return v.to(device, non_blocking=True) if isinstance(v, Batch) else v

    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def to_driver(value: Any, device: torch.device | None) -> Any:
    """The result `value` of a worker on `device`, with every tensor on the CPU (recursing
    into Batch, list, tuple, dict). A CPU worker's result is returned as it is."""
    if is_host(device):
        return value
    return _cpu(value)


def is_host(device: torch.device | None) -> bool:
    """The driver's own memory: None or the CPU. Another CPU index (cpu:1) is a device of its
    own: tests/test_device_faults.py gives workers one to catch device faults on the CPU."""
    return device is None or (device.type == "cpu" and device.index in (None, 0))


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value if is_host(value.device) else value.cpu()
    if isinstance(value, Batch):
        if all(is_host(t.device) for t in value.tensors.values()):
            return value
        return value.to("cpu")
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):  # not a namedtuple
        return type(value)(_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    return value


def enable_tf32(device: torch.device) -> None:
    """TF32 for fp32 matmuls and convolutions on CUDA (Ampere and later); nothing on the CPU,
    whose fp32 numerics stay exact. The CUDA run itself is tests/gpu/ (no GPU in CI)."""
    if device.type == "cuda":
        tf32_on()


def tf32_on() -> None:
    """Set TF32 through torch's legacy API, which keeps both APIs readable: after a write
    through the new one (`matmul.fp32_precision = "tf32"`, torch >= 2.9) any legacy read
    (`torch.get_float32_matmul_precision()`, which inductor calls; `matmul.allow_tf32`)
    raises "mix of the legacy and new APIs" (torch 2.13). The legacy call also sets oneDNN's
    CPU matmuls to TF32: put back as they were, so CPU fp32 stays exact in a GPU worker too."""
    cpu = getattr(torch.backends.mkldnn, "matmul", None)
    before = getattr(cpu, "fp32_precision", None)  # torch >= 2.9
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    if before is not None:
        cpu.fp32_precision = before
