"""turn_grpo by hand: per-turn returns, one weight per trajectory, groups from group_index."""

from __future__ import annotations

import math

import torch

from baton.algos import ADVANTAGES, compute_advantages, grpo_advantages
from baton.algos.turn_credit import turn_grpo_advantages, turn_segments


def test_turn_segments():
    m = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 0]])
    assert turn_segments(m).tolist() == [[0, 0, -1, -1, 1, -1, 2, -1]]


def test_length_bias_short_success_long_failure():
    # row 0: one turn, reward 1 at its end; row 1: three turns (holes between), reward 0.
    mask = torch.tensor([[1, 1, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 1, 0]])
    rewards = torch.zeros(2, 7, dtype=torch.float64)
    rewards[0, 1] = 1.0
    gi = torch.tensor([7, 7])
    adv, ret = turn_grpo_advantages(token_rewards=rewards, response_mask=mask, group_index=gi, eps=0.0)
    # by hand: G = [1], [0, 0, 0]; per-trajectory mean b = (1 + 0)/2 = 0.5;
    # s^2 = ((1-.5)^2 + (1/3)*3*(0-.5)^2) / (2-1) = 0.5 -> s = 0.7071; A = +-0.7071 (= GRPO)
    s = math.sqrt(0.5)
    assert torch.allclose(adv[0], torch.tensor([0.5 / s, 0.5 / s, 0, 0, 0, 0, 0], dtype=torch.float64))
    assert torch.allclose(adv[1], torch.tensor([-0.5 / s, 0, -0.5 / s, 0, -0.5 / s, -0.5 / s, 0], dtype=torch.float64))
    g, _ = grpo_advantages(scores=torch.tensor([1.0, 0.0], dtype=torch.float64), response_mask=mask,
                           group_index=gi, eps=0.0)
    assert torch.allclose(adv, g)  # trajectory reward only: exactly GRPO
    # naive pooled per-turn normalisation would have baseline (1 + 0 + 0 + 0) / 4 = 0.25:
    # the long failure's turns would get -0.25 / std, the short success +0.75 / std (biased).
    pooled_mean = torch.tensor([1.0, 0, 0, 0]).mean()
    assert pooled_mean == 0.25 and adv[1, 0] == -adv[0, 0]


def test_per_turn_rewards_reach_earlier_turns_and_short_groups():
    # group A: row 0 with turn rewards [0.5, 1] (2 turns), row 1 with [0] (1 turn); group B: one row
    mask = torch.tensor([[1, 0, 1], [1, 0, 0], [1, 1, 0]])
    r = torch.tensor([[0.5, 0, 1.0], [0, 0, 0], [3.0, 0, 0]], dtype=torch.float64)
    adv, ret = turn_grpo_advantages(token_rewards=r, response_mask=mask, group_index=torch.tensor([0, 0, 5]),
                                    eps=0.0)
    # G row0 = [1.5, 1.0], row1 = [0]; b = (1/2)(1.25 + 0) = 0.625
    # s^2 = (0.5*(0.875^2 + 0.375^2) + (0.625)^2) / 1 = 0.453125 + 0.390625 = 0.84375
    s = math.sqrt(0.84375)
    assert torch.allclose(ret[0], torch.tensor([1.5, 0, 1.0], dtype=torch.float64))
    assert torch.allclose(adv[0], torch.tensor([0.875 / s, 0, 0.375 / s], dtype=torch.float64))
    assert torch.allclose(adv[1], torch.tensor([-0.625 / s, 0, 0], dtype=torch.float64))
    assert adv[2].abs().sum() == 0  # a group of one: no baseline


def test_registered_and_dispatched():
    assert "turn_grpo" in ADVANTAGES
    mask = torch.ones(2, 2)
    a, _ = compute_advantages("turn_grpo", token_rewards=torch.tensor([[0, 1.0], [0, 0]]), response_mask=mask,
                              group_index=torch.tensor([0, 0]), scores=torch.zeros(2))
    assert a[0, 0] > 0 > a[1, 0]
