"""Per-turn credit for multi-turn trajectories: the `turn_grpo` advantage estimator.

A row's response holds several policy turns separated by holes in `response_mask`
(observation / template tokens). `token_rewards` [B, R] carries the per-turn rewards at
each turn's last policy token, the trajectory reward at the last one. For turn k of row i,
with K_i turns and gamma the per-turn discount:

    G_ik = sum_{j >= k} gamma^(j-k) r_ij                  return-to-go of the turn
    b    = (1/N) sum_i (1/K_i) sum_k G_ik                 each trajectory counts ONCE
    s^2  = 1/(N-1) sum_i (1/K_i) sum_k (G_ik - b)^2        (N rows in the group)
    A_ik = (G_ik - b) / (s + eps) on every policy token of turn k

Why this choice:
- Length bias. Naive per-turn normalisation pools all (row, turn) returns of a group, so a
  row with K turns pulls the baseline K times: long trajectories drag the baseline toward
  their own return and get advantages shrunk toward 0, short ones get them amplified. With
  a 1-turn success and a 3-turn failure the naive baseline is 0.25: the failure costs each
  of its turns only -0.25 while the success earns +0.75. Weighting each row's turns by
  1/K_i makes the group statistics per trajectory (the test has this case by hand).
- Reduces to GRPO: with only a trajectory reward, G_ik = R_i for every k, so b and s are
  the GRPO group mean and (unbiased) std: the default multi-turn recipe is plain GRPO.
- A constant baseline per group (no per-position baseline): positions reached by a single
  row would otherwise get advantage 0 (SkyRL #1507's "most steps get zero advantage"), and
  the gradient stays unbiased (the baseline does not depend on the row's own later turns
  beyond the usual GRPO leave-in). Per-turn rewards reach every earlier turn through G.
Groups come from `group_index` (rows of a group may be fewer than n: dropped trajectories).
A group of one row gets 0. Turns are the maximal runs of 1 in `response_mask`.
"""

from __future__ import annotations

import torch

from baton.algos.advantages import group_inverse, register_advantage


def turn_segments(response_mask: torch.Tensor) -> torch.Tensor:
    """[B, R] long: the policy-turn number of each masked token (runs of 1), -1 elsewhere."""
    m = response_mask.long()  # [B, R]
    starts = (m - torch.nn.functional.pad(m, (1, 0))[:, :-1]).clamp(min=0)  # [B, R] 1 where a run starts
    turn = starts.cumsum(1) - 1  # [B, R]
    return torch.where(m.bool(), turn, torch.full_like(turn, -1))


@register_advantage("turn_grpo", inputs=("token_rewards", "response_mask", "group_index"), hyper={"gamma": "gamma"})
def turn_grpo_advantages(*, token_rewards: torch.Tensor, response_mask: torch.Tensor,
                         group_index: torch.Tensor | None = None, group_size: int | None = None,
                         gamma: float = 1.0, eps: float = 1e-6):
    """See the module docstring. Returns (advantages [B, R], returns [B, R] = G per token)."""
    B = token_rewards.shape[0]
    turn = turn_segments(response_mask)  # [B, R]
    K = int(turn.max()) + 1 if turn.numel() else 0
    rw = token_rewards.detach().double() * response_mask.double()  # [B, R]
    r_turn = torch.zeros(B, max(K, 1), dtype=torch.float64)  # [B, K] reward of each turn
    idx = turn.clamp(min=0)
    r_turn.scatter_add_(1, idx, torch.where(turn >= 0, rw, 0.0))
    n_turns = (turn.max(1).values + 1).clamp(min=0)  # [B]
    valid = torch.arange(r_turn.shape[1]).unsqueeze(0) < n_turns.unsqueeze(1)  # [B, K]
    G = torch.zeros_like(r_turn)  # [B, K]
    running = torch.zeros(B, dtype=torch.float64)
    for k in reversed(range(r_turn.shape[1])):
        running = torch.where(valid[:, k], r_turn[:, k] + gamma * running, running)
        G[:, k] = torch.where(valid[:, k], running, 0.0)
    w = valid.double() / n_turns.clamp(min=1).unsqueeze(1).double()  # [B, K] 1/K_i on real turns
    inverse, n_groups = group_inverse(B, group_index, group_size)
    rows = torch.zeros(n_groups, dtype=torch.float64).index_add(0, inverse, torch.ones(B, dtype=torch.float64))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add(0, inverse, (w * G).sum(1)) / rows
    dev = (w * (G - mean[inverse].unsqueeze(1)) ** 2).sum(1)  # [B]
    var = torch.zeros(n_groups, dtype=torch.float64).index_add(0, inverse, dev) / (rows - 1).clamp(min=1)
    adv_turn = (G - mean[inverse].unsqueeze(1)) / (var.sqrt()[inverse].unsqueeze(1) + eps)  # [B, K]
    adv_turn = torch.where((rows[inverse] > 1).unsqueeze(1) & valid, adv_turn, 0.0)
    adv = torch.where(turn >= 0, adv_turn.gather(1, idx), 0.0)  # [B, R]
    ret = torch.where(turn >= 0, G.gather(1, idx), 0.0)
    dtype = token_rewards.dtype if token_rewards.is_floating_point() else torch.float32
    return adv.to(dtype), ret.to(dtype)
