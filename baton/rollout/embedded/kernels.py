"""The fast path's fused pieces (`baton.rollout.embedded.llama`): RMSNorm in one kernel and RoPE as
one batched matmul, so a decode step launches few kernels a layer (issue 43; counted by
`baton.rollout.embedded.op_count`).

RMSNorm: `aten._fused_rms_norm` (torch >= 2.8, CPU and CUDA kernels) is one kernel in every
dtype, where `functional.rms_norm` decomposes into ~6 ops on a CPU and HF's module into 8
(fp32 casts, pow, mean, add, rsqrt, two muls). In fp32 it gives HF's values bit for bit; in
bf16 / fp16 it rounds once (w * x * rstd) where HF rounds twice (x * rstd to the dtype,
then times w): at most one unit in the last place of the output. With `w=None` it is HF's
arithmetic in every dtype (the caller multiplies by w: two kernels). Older torch: HF's
arithmetic, op by op.

RoPE: HF rotates q and k as x * cos + rotate_half(x) * sin (~6 ops; the runner's
elementwise form, x * cos + roll(x) * sin', 3). For one decode token per row the rotation
is a [D, D] matrix per row, R = diag(cos) + Pm diag(sin') (Pm the half-roll permutation,
sin' the sine with rotate_half's sign folded in), so all q and k heads of a row rotate in
one `bmm` ([rows, heads, D] @ [rows, D, D]), R built once per step for every layer. Each
output sums two non-zero products (the zeros add exactly), in the matmul's order and
accumulation: within one rounding of the elementwise form (fp32: <= 1 ulp, measured).
"""

from __future__ import annotations

import torch
from torch.nn import functional

_FUSED_RMS_NORM = getattr(torch.ops.aten, "_fused_rms_norm", None)


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm of x over its last dim, times w (None: no scale), in one kernel where torch
    has it (see the module docstring for the rounding)."""
    if _FUSED_RMS_NORM is not None:
        return _FUSED_RMS_NORM(x, [x.shape[-1]], w, eps)[0]
    if x.dtype == torch.float32:
        return functional.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()  # HF: normalise in fp32, cast back, then scale
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if w is None else w * y


def half_roll(d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Pm [d, d]: x @ Pm == x.roll(d // 2, -1) (rotate_half up to the sign, which sin' holds)."""
    j = torch.arange(d, device=device)
    pm = torch.zeros(d, d, dtype=dtype, device=device)
    pm[(j - d // 2) % d, j] = 1
    return pm


def rope_matrices(cs: torch.Tensor, eye: torch.Tensor, pm: torch.Tensor) -> torch.Tensor:
    """R [rows, D, D] with x @ R == x * cos + roll(x) * sin' for each row's position:
    cs [rows, 2, D] (cos; sin'), eye the [D, D] identity, pm `half_roll(D)`. Two kernels."""
    return torch.addcmul(cs[:, :1] * eye, cs[:, 1:], pm)
