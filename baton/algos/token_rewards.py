"""Token-level rewards for PPO with a critic (and REINFORCE++): where the rewards land.

    token_level_rewards  the sequence score on the last real response token, 0 elsewhere
    kl_in_reward         adds -beta * KL(pi_old || ref) on every real token (InstructGPT's
                         per-token KL penalty), returns the rewards and the mean KL paid

Together (verl's `apply_kl_penalty`, OpenRLHF's `compute_reward`):

    rewards = token_level_rewards(scores, mask)                       # [B, R]
    rewards, kl = kl_in_reward(rewards, old_logprobs, ref_logprobs, mask, beta=ctl.value)
    ctl.update(kl, n_steps=B)                                         # baton.algos.kl_control
    adv, returns = compute_advantages("gae", token_rewards=rewards, values=values, ...)

"Last real token" is the highest index whose mask is set, so a multi-turn mask with holes
(tool output) still gets the reward at the end of the final turn. A row whose mask is all
zero (batch padding) gets no reward at all.
"""

from __future__ import annotations

import torch

from baton.algos.kl import kl_penalty
from baton.algos.masked import masked_mean


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place scores [B] on the last real token of response_mask [B, R]; returns [B, R]."""
    mask = response_mask.bool()  # [B, R]
    positions = torch.arange(mask.shape[-1], device=mask.device)  # [R]
    last = torch.where(mask, positions, -1).amax(-1)  # [B]; -1 = empty row
    scores = scores if scores.is_floating_point() else scores.float()
    onehot = (positions == last.unsqueeze(-1)) & (last >= 0).unsqueeze(-1)  # [B, R]
    return torch.where(onehot, scores.unsqueeze(-1), torch.zeros((), dtype=scores.dtype,
                                                                 device=scores.device))  # [B, R]


@torch.no_grad()
def kl_in_reward(token_rewards: torch.Tensor, old_logprobs: torch.Tensor,
                 ref_logprobs: torch.Tensor, response_mask: torch.Tensor, beta: float,
                 estimator: str = "k1") -> tuple[torch.Tensor, torch.Tensor]:
    """token_rewards - beta * KL_t on the real tokens; all inputs [B, R].

    KL_t = KL_ESTIMATORS[estimator](old_logprobs, ref_logprobs): the policy that sampled the
    tokens against the reference. Default k1 (log pi_old - log ref), as verl's "kl" and
    OpenRLHF's default: as a *reward* its expectation is the true KL (k3 is also unbiased,
    "abs" and k2 are not). Returns (rewards [B, R], zero on padding; mean KL, a 0-d tensor).

    The mean KL is the one the adaptive controller should see, computed as verl does: the
    per-sequence token-mean of KL_t, averaged over the non-empty sequences; so `target_kl` is
    a per-token KL. (TRL / Ziegler et al. sum over the sequence instead: their targets are
    per-sequence and about |y| times larger.) It is the KL actually paid in the rewards, before
    multiplying by beta. Everything here is detached: rewards never carry gradient.
    """
    mask = response_mask.bool()  # [B, R]
    kl = kl_penalty(old_logprobs.float(), ref_logprobs.float(), estimator)  # [B, R]
    kl = torch.where(mask, kl, 0.0)  # [B, R]
    rewards = torch.where(mask, token_rewards - beta * kl, 0.0)  # [B, R]
    per_seq = masked_mean(kl, mask, dim=-1)  # [B]
    mean_kl = masked_mean(per_seq, mask.any(-1))  # mean over non-empty rows
    return rewards, mean_kl
