"""Kernels a step launches, counted on any device by a dispatch recorder: every aten op that
reaches the dispatcher under a `TorchDispatchMode`, less the ops that only make a view
(no kernel on any device). On a GPU each counted op is (at least) one kernel launch, so
the count is the CPU-checkable proxy for a decode step's launches (issue 43): tests assert
it, `bench/decode_ops.py` prints it.

Composite ops that torch's CUDA build runs as one kernel but a CPU decomposes would count
as their pieces: `aten._fused_rms_norm` (RMSNorm; torch >= 2.8 has a CUDA kernel for it,
the CPU build only the composite of ~6 ops). While counting, a CPU stand-in for that CUDA
kernel is registered (`_cuda_like`: a MOCK of a CUDA-only kernel, the same math), so the
CPU counts what a GPU launches. SDPA is one op on both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that return a view or alias of their input and launch nothing
VIEW_OPS = frozenset({
    "aten.view", "aten._unsafe_view", "aten.slice", "aten.select", "aten.unsqueeze", "aten.squeeze",
    "aten.split", "aten.split_with_sizes", "aten.chunk", "aten.unbind", "aten.expand", "aten.t",
    "aten.transpose", "aten.permute", "aten.as_strided", "aten.alias", "aten.detach", "aten.diagonal",
    "aten.narrow", "aten.reshape", "aten.view_as_real", "aten.view_as_complex", "aten.unflatten",
    "aten.flatten", "aten.lift_fresh", "aten._reshape_alias",
})


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name not in VIEW_OPS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _rms_norm_standin(x, normalized_shape, w, eps):
    # MOCK of the CUDA-only kernel `aten._fused_rms_norm` (see the module docstring): the
    # composite's math, as one op (the mode is off inside its own dispatch)
    dims = tuple(range(-len(normalized_shape), 0))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + (torch.finfo(x.dtype).eps if eps is None else eps))
    y = xf * rstd
    return (y if w is None else y * w.float()).to(x.dtype), rstd


@contextmanager
def _cuda_like() -> Iterator[None]:
    """While inside: aten._fused_rms_norm has a CPU kernel (the stand-in), as it has a CUDA one."""
    op = "aten::_fused_rms_norm"
    if not torch._C._dispatch_has_kernel(op) or torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU"):
        yield  # an older torch without it, or one with a real CPU kernel
        return
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("_fused_rms_norm", _rms_norm_standin, "CPU")
        yield
    finally:
        lib._destroy()


def count_kernels(fn: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """Run fn() and return (its result, {aten op: calls}) of the kernel-launching ops it
    dispatched (views left out) as a GPU would launch them (see the module docstring); sum
    the counter's values for the total. fn's result is for shapes, not values: the
    stand-in kernel's rounding is not the CPU composite's."""
    with torch.no_grad(), _cuda_like(), _Recorder() as rec:
        out = fn()
    return out, rec.ops
