"""Masked reductions over padded [B, R] tensors (padding must never count as data).

An all-zero mask yields 0 rather than NaN: an empty micro-batch (e.g. a padding row
added by `Batch.chunk`) must not poison the loss or the metrics.
"""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` where `mask` is set; `where` (not `x * mask`) so NaN/inf in padding stay out."""
    masked = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))  # [B, R]
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over the masked entries (over all of them, or along `dim`); 0 if none."""
    count = mask.sum() if dim is None else mask.sum(dim)
    total = masked_sum(x, mask, dim)
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (a scalar). `unbiased` applies Bessel's n/(n-1)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        var = var * n / (n - 1).clamp(min=1)  # one element: variance 0, not a division by 0
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries; masked-out entries become 0.

    Variance is unbiased (as in verl / OpenRLHF). With `shift_mean=False` the mean is added
    back (scale-only whitening). Zeroing the padding means a whitened advantage can be
    multiplied into a loss without re-masking.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    white = (x - mean) * torch.rsqrt(var + eps)  # [B, R]
    if not shift_mean:
        white = white + mean
    return torch.where(mask.bool(), white, torch.zeros_like(white))
