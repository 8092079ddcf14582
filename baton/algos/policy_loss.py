"""Per-token policy losses, chosen by name from `POLICY_LOSSES` (ppo_clip, vanilla, gspo).

Every policy loss takes keyword-only `logprobs, old_logprobs, advantages, response_mask`
(all [B, R]) plus its own hyper-parameters, and returns `(loss [B, R], metrics)`: the
per-token loss, zero on padding, to be reduced by `aggregate_loss`; metrics are 0-d
detached tensors (no `.item()` here, so nothing forces a device sync), each a masked mean
over this micro-batch. The PPO value loss lives in `baton.algos.value` (re-exported here).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from baton.algos.masked import masked_mean
from baton.algos.registry import Registry, hyper_args
from baton.algos.value import value_loss  # noqa: F401  (its old home; import from value)

POLICY_LOSSES = Registry("policy loss")
POLICY_LOSS_HYPER: dict[str, dict[str, str]] = {}  # name -> {keyword: "algo.<key>" it is given}


def register_policy_loss(name: str, hyper: dict[str, str] | None = None) -> Callable[[Any], Any]:
    """Decorator: a policy loss by `name`, and the hyper-parameters the trainer passes it from
    the config (`hyper`: keyword -> `algo.<key>`, as estimators declare theirs); the config
    refuses those keys set with another loss (`baton.algos.config.dependent_keys`)."""
    def deco(fn: Any) -> Any:
        POLICY_LOSSES.add(name, fn)
        POLICY_LOSS_HYPER[name] = dict(hyper or {})
        return fn
    return deco


def policy_loss_args(name: str, algo: Any) -> dict[str, Any]:
    """The declared hyper-parameters of policy loss `name`, their values in `algo`, by keyword."""
    return hyper_args(POLICY_LOSS_HYPER.get(name, {}), algo)

# exp() of a larger log-ratio overflows float32 / is meaningless; verl clamps the same way.
LOG_RATIO_CLAMP = 20.0


def _zero_padding(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), loss, torch.zeros((), dtype=loss.dtype, device=loss.device))


@register_policy_loss("ppo_clip", hyper={"clip_low": "clip_low", "clip_high": "clip_high", "dual_clip": "dual_clip"})
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


@register_policy_loss("gspo")
def gspo_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
              advantages: torch.Tensor, response_mask: torch.Tensor,
              clip_low: float = 3e-4, clip_high: float | None = 4e-4):
    """GSPO (Zheng et al. 2025): PPO clipping on the *sequence* importance ratio
    s_i = exp(mean over the sequence's real tokens of (logp - old_logp)), i.e. the
    length-normalised ratio pi(y|x)^(1/|y|) / pi_old(y|x)^(1/|y|).

    Applied per token as the paper's GSPO-token form: s_i,t = sg[s_i] * pi_t / sg[pi_t], whose
    value is s_i on every token of the sequence and whose gradient is s_i grad log pi_t; so
    loss_t = max(-A s_i,t, -A clip(s_i,t, 1 - clip_low, 1 + clip_high)) and, with one advantage
    per sequence, aggregating with "seq-mean-token-mean" (the paper's 1/G sum_i 1/|y_i| sum_t)
    gives exactly GSPO's gradient. Clip ranges default to the paper's 3e-4 / 4e-4 (sequence
    ratios stay far closer to 1 than token ratios); clip_high None = clip_low.

    Departure from verl: the log-ratio is clamped to +-20 (verl: max 10), like ppo_clip.
    Metrics: clip_frac (tokens of clipped sequences), approx_kl (token k3 of KL(old || new)),
    ratio_mean (mean sequence ratio over non-empty sequences).
    """
    clip_high = clip_low if clip_high is None else clip_high
    real = response_mask.bool()  # [B, R]
    logprobs = _zero_padding(logprobs, real)  # [B, R] padding garbage (-inf) must not reach
    log_ratio = logprobs - _zero_padding(old_logprobs, real)  # [B, R]   exp() or the gradient
    seq_log_ratio = masked_mean(log_ratio, real, dim=-1)  # [B]
    log_s = logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [B, R]
    s = torch.exp(log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # [B, R] value s_i
    unclipped = -advantages * s  # [B, R]
    clipped = -advantages * s.clamp(1 - clip_low, 1 + clip_high)  # [B, R]
    loss = torch.maximum(unclipped, clipped)  # [B, R]
    with torch.no_grad():
        tok_log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, R]
        seq_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [B]
        metrics = {"clip_frac": masked_mean((clipped > unclipped).float(), response_mask),
                   "approx_kl": masked_mean(tok_log_ratio.exp() - 1 - tok_log_ratio, response_mask),
                   "ratio_mean": masked_mean(seq_ratio, response_mask.sum(-1) > 0)}
    return _zero_padding(loss, response_mask), metrics
