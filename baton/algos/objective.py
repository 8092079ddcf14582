"""The actor's scalar loss for one micro-batch, composed of the primitives: the PPO family's
policy loss as the actor worker computes it (`baton.workers.actor` calls `actor_loss`).

per_token = policy_loss + kl_coef * KL(policy || ref) - entropy_coef * entropy
(+ distill: a distillation divergence per token, `baton.algos.distill`), then one
aggregation for the sum (aggregation is linear, so aggregating the terms separately with
the same normalisers gives the same number). Off-policy corrections (truncated-IS weights
against the engine's behaviour logprobs, `baton.algos.off_policy`) are not an argument: the
driver scales the advantages by them before the loss (w * loss(A) = loss(w * A)).
"""

from __future__ import annotations

import torch

from baton.algos.aggregate import aggregate_loss
from baton.algos.kl import kl_penalty
from baton.algos.masked import masked_mean
from baton.algos.policy_loss import POLICY_LOSSES


def actor_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
               advantages: torch.Tensor, response_mask: torch.Tensor,
               ref_logprobs: torch.Tensor | None = None, entropy: torch.Tensor | None = None,
               policy_loss: str = "ppo_clip", policy_loss_kwargs: dict | None = None,
               kl_estimator: str = "k3", kl_coef: float = 0.0, entropy_coef: float = 0.0,
               agg_mode: str = "token-mean", global_tokens=None, global_seqs=None,
               max_len: int | None = None, distill: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar loss of a micro-batch and its metrics (all inputs [B, R]).

    GRPO: advantages from ADVANTAGES["grpo"], kl_coef > 0 with k3 and ref_logprobs.
    DAPO: kl_coef 0, policy_loss_kwargs clip_high > clip_low, agg_mode "token-mean".
    Dr. GRPO: ADVANTAGES["dr_grpo"], agg_mode "seq-mean-token-sum-norm" with max_len.
    GSPO: policy_loss "gspo", agg_mode "seq-mean-token-mean".
    Truncated-IS weights (`baton.algos.off_policy`) reach the loss through `advantages`: the
    driver scales them (w * loss(A) = loss(w * A) for every policy loss, tests/trainers/test_ppo_pieces.py).
    distill [B, R]: a distillation loss per token (`DISTILL_LOSSES`, with its gradient), added.
    """
    per_token, metrics = POLICY_LOSSES[policy_loss](
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
        response_mask=response_mask, **(policy_loss_kwargs or {}))  # [B, R]
    # a local aggregate, like every other metric here (not this micro-batch's share of the
    # global loss), so averaging it over micro-batches approximates the step's pg loss
    metrics["pg_loss"] = aggregate_loss(per_token, response_mask, agg_mode,
                                        max_len=max_len).detach()
    if kl_coef:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)  # [B, R]
        per_token = per_token + kl_coef * kl
        metrics["kl"] = masked_mean(kl, response_mask).detach()
    if distill is not None:
        per_token = per_token + distill
        metrics["distill_loss"] = masked_mean(distill, response_mask).detach()
    if entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs entropy")
        per_token = per_token - entropy_coef * entropy  # maximise entropy
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy, response_mask).detach()
    loss = aggregate_loss(per_token, response_mask, agg_mode, global_tokens, global_seqs, max_len)
    return loss, metrics
