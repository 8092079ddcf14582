"""Token log-probabilities and entropies from logits, at the sampling temperature.

Memory: for a [B, R, V] logit tensor with V ~ 150k, `log_softmax` materialises a second
[B, R, V] tensor. Here log p(label) = logit[label] - logsumexp(logits) keeps only [B, R]
results, and low-precision logits are upcast to float32 one row at a time, so the float32
copy is [R, V] instead of [B, R, V] (forward only; autograd still saves what it needs).
"""

from __future__ import annotations

import torch


def _scale(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # Temperature 0 means greedy sampling; by the Engine protocol its logprobs are taken at
    # temperature 1, so the trainer's ratio of an unchanged policy is exactly 1.
    if temperature in (0.0, 1.0):
        return logits
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return logits / temperature  # [B, R, V]


def _rowwise_fp32(fn, logits: torch.Tensor) -> torch.Tensor:
    """Apply `fn` (float [.., V] -> [..]) in at least float32; low-precision [B, R, V] row by row."""
    if logits.dtype in (torch.float32, torch.float64):
        return fn(logits)
    if logits.dim() < 3:
        return fn(logits.float())
    return torch.stack([fn(row.float()) for row in logits])  # [B, R]


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor,
                         temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / temperature) gathered at `labels`.

    logits [B, R, V] (any float dtype), labels [B, R] long (valid ids everywhere: mask
    padding separately, do not use -100). Returns float32 (or float64) [B, R].
    """
    logits = _scale(logits, temperature)  # [B, R, V]
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # [B, R]
    lse = _rowwise_fp32(lambda z: torch.logsumexp(z, dim=-1), logits)  # [B, R]
    return picked.to(lse.dtype) - lse  # [B, R]


def _entropy_fp32(z: torch.Tensor) -> torch.Tensor:
    # H = logsumexp(z) - sum softmax(z) * z: no [.., V] log-prob tensor is kept.
    p = torch.softmax(z, dim=-1)  # [.., V]
    return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)  # [..]


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position: [B, R, V] -> [B, R]."""
    return _rowwise_fp32(_entropy_fp32, _scale(logits, temperature))  # [B, R]
