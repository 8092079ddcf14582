"""Token log-probabilities and entropies from logits, at the sampling temperature.

Memory: for a [B, R, V] logit tensor with V ~ 150k, `log_softmax` materialises a second
[B, R, V] tensor. Here log p(label) = logit[label] / T - logsumexp(logits / T) keeps only
[B, R] results, and low-precision logits are upcast to float32 (then divided by T) one row
at a time, so the float32 copy is [R, V] instead of [B, R, V] (forward only; autograd
still saves what backward needs). Dividing after the upcast also avoids a bf16 rounding
of logits / T.
"""

from __future__ import annotations

import torch


def _inv_temperature(temperature: float) -> float:
    # Temperature 0 means greedy sampling; by the Engine protocol its logprobs are taken at
    # temperature 1, so the trainer's ratio of an unchanged policy is exactly 1.
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return 1.0 if temperature == 0 else 1.0 / temperature


def _rowwise(fn, logits: torch.Tensor, inv_t: float) -> torch.Tensor:
    """fn(z [.., V] in >= float32, already divided by T) -> [..]; low-precision rows one at a time."""
    def scaled(z: torch.Tensor) -> torch.Tensor:
        z = z if z.dtype in (torch.float32, torch.float64) else z.float()
        return fn(z if inv_t == 1.0 else z * inv_t)

    if logits.dtype in (torch.float32, torch.float64) or logits.dim() < 3:
        return scaled(logits)
    return torch.stack([scaled(row) for row in logits])  # [B, R]


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor,
                         temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / temperature) gathered at `labels`.

    logits [B, R, V] (any float dtype), labels [B, R] long (valid ids everywhere: mask
    padding separately, do not use -100). Returns float32 (float64 for float64 input) [B, R].
    """
    inv_t = _inv_temperature(temperature)
    lse = _rowwise(lambda z: torch.logsumexp(z, dim=-1), logits, inv_t)  # [B, R]
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).to(lse.dtype)  # [B, R]
    return picked * inv_t - lse  # [B, R]


def _entropy(z: torch.Tensor) -> torch.Tensor:
    # H = logsumexp(z) - sum softmax(z) * z: no [.., V] log-prob tensor is kept.
    p = torch.softmax(z, dim=-1)  # [.., V]
    return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)  # [..]


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position: [B, R, V] -> [B, R]."""
    return _rowwise(_entropy, logits, _inv_temperature(temperature))  # [B, R]
