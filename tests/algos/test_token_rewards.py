"""Token-level rewards, KL in the reward, and the KL coefficient controllers."""

import json
import math

import pytest
import torch

from baton.algos import KL_CONTROLLERS, AdaptiveKLController, FixedKLController, kl_in_reward, \
    token_level_rewards


def test_score_lands_on_the_last_real_token():
    # row 0: 3 real tokens -> score at index 2; row 1: a hole [1, 0, 1, 0] -> index 2 (the last
    # real token, after the hole); row 2: empty (batch padding) -> no reward; int scores accepted
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0]])
    r = token_level_rewards(torch.tensor([2, -1, 5]), mask)
    assert torch.equal(r, torch.tensor([[0.0, 0, 2, 0], [0, 0, -1, 0], [0, 0, 0, 0]]))


def test_kl_in_reward_hand_worked():
    # beta 0.5, k1: old - ref on real tokens. row 0: [ln 2, 0, -ln 2], score 1 on the last token
    #   rewards = [-0.5 ln 2, 0, 1 + 0.5 ln 2] = [-0.346574, 0, 1.346574]
    # row 1: mask [1, 0, 0], old - ref = [0.2, garbage...] -> rewards [3 - 0.1, 0, 0]
    # mean KL = mean over rows of the per-row token mean = (0 / 3 + 0.2 / 1) / 2 = 0.1
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    scores = token_level_rewards(torch.tensor([1.0, 3.0]), mask)
    old = torch.tensor([[math.log(2), 0.0, -math.log(2)], [0.2, 50.0, float("nan")]])
    ref = torch.zeros(2, 3)
    rewards, kl = kl_in_reward(scores, old, ref, mask, beta=0.5)
    ln2 = math.log(2)
    torch.testing.assert_close(rewards, torch.tensor([[-0.5 * ln2, 0, 1 + 0.5 * ln2], [2.9, 0, 0]]))
    assert kl.item() == pytest.approx(0.1)
    # k3 instead: row 0 [e^-ln2 + ln2 - 1, 0, e^ln2 - ln2 - 1] = [0.193147, 0, 0.306853]
    _, kl3 = kl_in_reward(scores, old, ref, mask, beta=0.5, estimator="k3")
    k3_row1 = math.exp(-0.2) + 0.2 - 1
    assert kl3.item() == pytest.approx(((0.5 - 1 + 2 - 1) / 3 + k3_row1) / 2, rel=1e-5)


def test_kl_in_reward_is_detached_and_ignores_empty_rows():
    old = torch.tensor([[0.3, 0.1], [7.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [0, 0]])
    rewards, kl = kl_in_reward(torch.zeros(2, 2), old, torch.zeros(2, 2), mask, beta=1.0)
    assert not rewards.requires_grad and kl.item() == pytest.approx(0.2)  # row 1 is not a sequence
    assert torch.equal(rewards[1], torch.zeros(2))


def test_adaptive_controller_hand_worked():
    # beta 0.1, target 6, horizon 1000, n_steps 100:
    #   kl 9: error clip(9/6 - 1 = 0.5) = 0.2 -> beta * (1 + 0.2 * 0.1) = 0.102
    #   kl 4.5: error 4.5/6 - 1 = -0.25 -> clipped -0.2 -> 0.102 * 0.98 = 0.09996
    #   kl 6.6: error 0.1 -> 0.09996 * 1.01 = 0.1009596
    ctl = KL_CONTROLLERS["adaptive"](kl_coef=0.1, target_kl=6.0, horizon=1000)
    ctl.update(9.0, n_steps=100)
    assert ctl.value == pytest.approx(0.102)
    ctl.update(4.5, n_steps=100)
    assert ctl.value == pytest.approx(0.09996)
    ctl.update(torch.tensor(6.6), n_steps=100)  # a 0-d tensor from kl_in_reward is accepted
    assert ctl.value == pytest.approx(0.1009596)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)


def test_fixed_controller_and_exact_resume():
    fixed = FixedKLController(0.05)
    fixed.update(100.0, 64)
    assert fixed.value == 0.05 and KL_CONTROLLERS["fixed"] is FixedKLController
    # run 10 updates; checkpoint after 4 (through JSON, as a run-state file would), resume in a
    # fresh controller: the remaining 6 give the same beta bit for bit
    kls = [0.3, 0.01, 0.2, 0.17, 0.5, 0.02, 0.11, 0.13, 0.4, 0.09]
    a = AdaptiveKLController(0.1, target_kl=0.1, horizon=500)
    for k in kls[:4]:
        a.update(k, 32)
    saved = json.loads(json.dumps(a.state_dict()))
    for k in kls[4:]:
        a.update(k, 32)
    b = AdaptiveKLController(0.1, target_kl=0.1, horizon=500)
    b.load_state_dict(saved)
    for k in kls[4:]:
        b.update(k, 32)
    assert b.value == a.value and a.value != 0.1
    f2 = FixedKLController(1.0)
    f2.load_state_dict(fixed.state_dict())
    assert f2.value == 0.05
