"""Train/inference mismatch correction: truncated importance sampling (TIS) against the
inference engine's behaviour logprobs (Yao et al. 2025, "Your efficient RL framework secretly
brings you off-policy RL training").

The rollout engine (vLLM, bf16 kernels, different batching) samples from mu, which is not
exactly the trainer's pi_old even with the same weights. The PPO ratio pi / pi_old corrects
for the policy update only; TIS multiplies each token's policy loss by

    w_t = min(pi_old(y_t) / mu(y_t), cap)      (detached; cap = C, 2 in the paper)

to correct the rest, truncated so that a token the engine found far likelier than the
trainer cannot dominate. Pass the weights to `actor_loss(tis_weights=...)`; they scale the
policy-gradient term only (not the KL or entropy terms), as in verl.

Metrics:
    rollout/tis_capped_frac        fraction of real tokens whose ratio exceeded the cap
    rollout/tis_weight_mean        mean weight after the cap
    rollout/logprob_mismatch_kl    k3 estimate of KL(mu || pi_old) on the sampled tokens:
                                   r - 1 - log r with r = pi_old / mu (unbiased, >= 0, and
                                   low-variance for the tiny KLs expected here; verl's k3_kl)
Departure: the log ratio is clamped to +-20 before exp (a numerical guard, as elsewhere).
"""

from __future__ import annotations

import torch

from baton.algos.masked import masked_mean

LOG_RATIO_CLAMP = 20.0


@torch.no_grad()
def truncated_is_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                         response_mask: torch.Tensor, cap: float = 2.0,
                         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token TIS weights [B, R] (1 on padding, so they can be multiplied in blindly) and
    metrics (0-d detached tensors, see the module docstring). Inputs [B, R]."""
    mask = response_mask.bool()  # [B, R]
    log_ratio = torch.where(mask, old_logprobs.float() - rollout_logprobs.float(), 0.0)  # [B, R]
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()  # [B, R]
    weights = ratio.clamp(max=cap)  # [B, R]
    metrics = {
        "rollout/tis_capped_frac": masked_mean((ratio > cap).float(), mask),
        "rollout/tis_weight_mean": masked_mean(weights, mask),
        "rollout/logprob_mismatch_kl": masked_mean(ratio - 1 - log_ratio, mask),
    }
    return weights, metrics
