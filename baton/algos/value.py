"""The PPO critic's loss and its fit metric (value head trained on GAE returns).

    value_loss        per-token 0.5 (V - G)^2, or the clipped form
                      0.5 max((V - G)^2, (clip(V, V_old - c, V_old + c) - G)^2)
    critic_loss       value_loss reduced by `aggregate_loss` (same modes and global normalisers
                      as the actor, so the critic gradient is micro-batch/DP invariant too)
    explained_variance 1 - Var(G - V) / Var(G) over the real tokens

Departure from verl / TRL (same formula): the clipped value is `torch.clamp(V, V_old - c,
V_old + c)`, not `V_old + (V - V_old).clamp(-c, c)`. The latter rounds in float32: for an
unclipped token `V_old + (V - V_old)` need not equal V, so the clipped error can come out a
hair larger and the token is reported as clipped (a few % of tokens, depending on the scale
of V). Clamping V itself returns V bit for bit when it is inside the range, so
`value_clip_frac`, which counts tokens where the clipped term is *strictly* larger, is
exactly 0 when nothing is clipped. The loss value is unaffected either way.
"""

from __future__ import annotations

import torch

from baton.algos.aggregate import Number, aggregate_loss
from baton.algos.masked import masked_mean, masked_var


def value_loss(*, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               response_mask: torch.Tensor, clip_range: float | None = None):
    """PPO critic loss per token [B, R] (zero on padding) and metrics.

    values (being trained), old_values (the critic at rollout time), returns (GAE targets),
    response_mask: all [B, R]. `clip_range` None = unclipped 0.5 (V - G)^2.
    Metrics: value_clip_frac (tokens where the clipped term is strictly larger, i.e. chosen).
    """
    err = (values - returns) ** 2  # [B, R]
    metrics = {}
    if clip_range is not None:
        clipped_v = torch.clamp(values, old_values - clip_range, old_values + clip_range)  # [B, R]
        err_clipped = (clipped_v - returns) ** 2  # [B, R]
        chosen = (err < err_clipped).float()  # [B, R]
        metrics["value_clip_frac"] = masked_mean(chosen, response_mask).detach()
        err = torch.maximum(err, err_clipped)  # [B, R]
    zero = torch.zeros((), dtype=err.dtype, device=err.device)
    loss = torch.where(response_mask.bool(), 0.5 * err, zero)  # [B, R]
    return loss, metrics


def critic_loss(*, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                response_mask: torch.Tensor, clip_range: float | None = None,
                agg_mode: str = "token-mean", global_tokens: Number | None = None,
                global_seqs: Number | None = None, max_len: int | None = None,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar critic loss of a micro-batch and its metrics (inputs [B, R]).

    Pass the normalisers exactly as for the actor (see `baton.algos.aggregate`): computed
    on the whole mini-batch, all-reduced SUM over DP ranks, backward() each micro-batch's
    loss as is. Metrics (local to this micro-batch, detached): value_loss (local aggregate),
    value_clip_frac (with clip_range), value_mean, explained_var.
    """
    per_token, metrics = value_loss(values=values, old_values=old_values, returns=returns,
                                    response_mask=response_mask, clip_range=clip_range)  # [B, R]
    loss = aggregate_loss(per_token, response_mask, agg_mode, global_tokens, global_seqs, max_len)
    metrics["value_loss"] = aggregate_loss(per_token, response_mask, agg_mode,
                                           max_len=max_len).detach()
    metrics["value_mean"] = masked_mean(values, response_mask).detach()
    metrics["explained_var"] = explained_variance(values.detach(), returns, response_mask)
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor,
                       eps: float = 1e-5) -> torch.Tensor:
    """1 - Var(returns - values) / (Var(returns) + eps) over the masked tokens (0-d tensor).

    1 = perfect critic, 0 = no better than predicting the mean return, < 0 = worse. Both
    variances unbiased (the Bessel factors cancel); eps 1e-5 as verl, so constant returns
    give 1 - Var(G - V) / eps rather than NaN.
    """
    var_ret = masked_var(returns, response_mask)
    var_diff = masked_var(returns - values, response_mask)
    return (1.0 - var_diff / (var_ret + eps)).detach()
