"""Per-token policy losses, chosen by name from `POLICY_LOSSES`, and the PPO value loss.

Every policy loss takes keyword-only `logprobs, old_logprobs, advantages, response_mask`
(all [B, R]) plus its own hyper-parameters, and returns `(loss [B, R], metrics)`: the
per-token loss, zero on padding, to be reduced by `aggregate_loss`; metrics are 0-d
detached tensors (no `.item()` here, so nothing forces a device sync), each a masked mean
over this micro-batch.
"""

from __future__ import annotations

import torch

from baton.algos.masked import masked_mean
from baton.algos.registry import Registry

POLICY_LOSSES = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register

# exp() of a larger log-ratio overflows float32 / is meaningless; verl clamps the same way.
LOG_RATIO_CLAMP = 20.0


def _zero_padding(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype, device=loss.device))


@register_policy_loss("ppo_clip")
def ppo_clip_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                  advantages: torch.Tensor, response_mask: torch.Tensor,
                  clip_low: float = 0.2, clip_high: float | None = None,
                  dual_clip: float | None = None):
    """PPO clipped surrogate (Schulman et al. 2017), loss = -min(r A, clip(r) A), with:

    * clip-higher (DAPO, Yu et al. 2025): the ratio is clipped to [1 - clip_low,
      1 + clip_high] with separate bounds (clip_high=None -> symmetric, = clip_low), so
      low-probability tokens with A > 0 can grow further before the gradient stops;
    * dual-clip (Ye et al. 2020): for A < 0 the loss is capped at -A * dual_clip (c > 1),
      so a huge ratio on a bad token cannot produce an unbounded loss.

    Departure: the log-ratio is clamped to +-20 before exp (numerical guard, as in verl).
    Metrics: clip_frac (tokens where the clipped term is chosen), dual_clip_frac,
    approx_kl (k3 estimate of KL(old || new) = mean(r - 1 - log r), >= 0), ratio_mean.
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, R]
    ratio = torch.exp(log_ratio)  # [B, R]
    unclipped = -advantages * ratio  # [B, R]
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)  # [B, R]
    loss = torch.maximum(unclipped, clipped)  # [B, R] pessimistic bound
    metrics = {"clip_frac": masked_mean((clipped > unclipped).float(), response_mask)}
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        cap = -advantages * dual_clip  # [B, R]
        capped = (advantages < 0) & (loss > cap)  # [B, R]
        loss = torch.where(capped, cap, loss)  # [B, R]
        metrics["dual_clip_frac"] = masked_mean(capped.float(), response_mask)
    with torch.no_grad():
        metrics["approx_kl"] = masked_mean(ratio - 1 - log_ratio, response_mask)
        metrics["ratio_mean"] = masked_mean(ratio, response_mask)
    metrics = {k: v.detach() for k, v in metrics.items()}
    return _zero_padding(loss, response_mask), metrics


@register_policy_loss("vanilla")
def vanilla_pg_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                    advantages: torch.Tensor, response_mask: torch.Tensor):
    """Unclipped importance-weighted policy gradient, loss = -r A. With old == current
    (one update per batch) its gradient is the REINFORCE gradient -A grad log p."""
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, R]
    ratio = torch.exp(log_ratio)  # [B, R]
    with torch.no_grad():
        metrics = {"approx_kl": masked_mean(ratio - 1 - log_ratio, response_mask),
                   "ratio_mean": masked_mean(ratio, response_mask)}
    return _zero_padding(-advantages * ratio, response_mask), metrics


def value_loss(*, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               response_mask: torch.Tensor, clip_range: float | None = None):
    """PPO critic loss per token [B, R]: 0.5 (V - G)^2, or with `clip_range` the clipped
    form 0.5 max((V - G)^2, (clip(V, V_old +- clip_range) - G)^2) (as in OpenAI baselines).
    Metrics: value_clip_frac (tokens where the clipped term is chosen)."""
    err = (values - returns) ** 2  # [B, R]
    metrics = {}
    if clip_range is not None:
        clipped_v = old_values + (values - old_values).clamp(-clip_range, clip_range)  # [B, R]
        err_clipped = (clipped_v - returns) ** 2  # [B, R]
        metrics["value_clip_frac"] = masked_mean((err_clipped > err).float(), response_mask).detach()
        err = torch.maximum(err, err_clipped)
    return _zero_padding(0.5 * err, response_mask), metrics
