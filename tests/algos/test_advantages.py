"""Advantage estimators on hand-worked examples (numbers derived in the comments)."""

import math

import pytest
import torch

from baton.algos import ADVANTAGE_INPUTS, ADVANTAGES, compute_advantages, discounted_returns, estimator_needs

S2 = math.sqrt(0.5)  # unbiased std of {1, 0}: sqrt((0.25 + 0.25) / (2 - 1))


def rows(t):
    """First column of a [B, R] advantage (every real token of a row holds the same value)."""
    return t[:, 0]


def test_grpo_groups_of_two():
    # rewards [1, 0 | 1, 1]: group 1 mean 0.5, std sqrt(0.5) -> +-0.5/0.7071 = +-0.7071;
    # group 2 is constant -> 0, not NaN
    adv, ret = ADVANTAGES["grpo"](scores=torch.tensor([1.0, 0, 1, 1]),
                                  response_mask=torch.ones(4, 3), group_size=2)
    torch.testing.assert_close(rows(adv), torch.tensor([S2, -S2, 0.0, 0.0]), atol=1e-5, rtol=0)
    assert torch.equal(adv, ret) and not adv.isnan().any()


def test_grpo_group_of_four_unbiased_std():
    # rewards [1, 0, 0, 0]: mean 0.25, deviations [.75, -.25, -.25, -.25],
    # unbiased var (0.5625 + 3 * 0.0625) / 3 = 0.25 -> std 0.5 -> [1.5, -0.5, -0.5, -0.5]
    adv, _ = ADVANTAGES["grpo"](scores=torch.tensor([1.0, 0, 0, 0]),
                                response_mask=torch.ones(4, 1), group_size=4)
    torch.testing.assert_close(rows(adv), torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5, rtol=0)
    # biased std would be sqrt(0.1875) = 0.4330 -> 0.75 / 0.4330 = 1.7321
    adv_b, _ = ADVANTAGES["grpo"](scores=torch.tensor([1.0, 0, 0, 0]), response_mask=torch.ones(4, 1),
                                  group_size=4, unbiased_std=False)
    assert math.isclose(adv_b[0, 0].item(), 0.75 / math.sqrt(0.1875), rel_tol=1e-5)


def test_grpo_broadcasts_over_mask_and_accepts_group_index():
    # group ids [7, 3, 7, 3], rewards [1, 1, 0, 1]: group 7 = {1, 0} -> +-0.7071, group 3 = {1, 1} -> 0
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    adv, _ = ADVANTAGES["grpo"](scores=torch.tensor([1.0, 1, 0, 1]), response_mask=mask,
                                group_index=torch.tensor([7, 3, 7, 3]))
    expected = torch.tensor([[S2, S2, 0], [0, 0, 0], [-S2, -S2, -S2], [0, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_dr_grpo_no_std():
    # rewards [1, 0 | 1, 1] -> centred only: [0.5, -0.5, 0, 0]
    adv, _ = ADVANTAGES["dr_grpo"](scores=torch.tensor([1.0, 0, 1, 1]),
                                   response_mask=torch.ones(4, 2), group_size=2)
    assert torch.equal(rows(adv), torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_rloo_leave_one_out():
    # G=2, [1, 0 | 1, 1]: 1 - 0 = 1, 0 - 1 = -1, 1 - 1 = 0, 0
    adv, _ = ADVANTAGES["rloo"](scores=torch.tensor([1.0, 0, 1, 1]),
                                response_mask=torch.ones(4, 1), group_size=2)
    torch.testing.assert_close(rows(adv), torch.tensor([1.0, -1.0, 0.0, 0.0]))
    # G=4, [1, 0, 0, 0]: 1 - mean(0,0,0) = 1; 0 - mean(1,0,0) = -1/3
    adv, _ = ADVANTAGES["rloo"](scores=torch.tensor([1.0, 0, 0, 0]),
                                response_mask=torch.ones(4, 1), group_size=4)
    torch.testing.assert_close(rows(adv), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def test_singleton_groups_get_zero():
    for name in ("grpo", "dr_grpo", "rloo"):
        adv, _ = ADVANTAGES[name](scores=torch.tensor([1.0, 0.0]), response_mask=torch.ones(2, 2),
                                  group_size=1)
        assert torch.equal(adv, torch.zeros(2, 2)), name


def test_reinforce_pp_baseline_batch_whitened():
    # [1, 0 | 1, 1] centred by group: [0.5, -0.5, 0, 0]; over the batch: mean 0,
    # unbiased var (0.25 + 0.25) / 3 = 1/6 -> [0.5, -0.5, 0, 0] * sqrt(6) = [1.2247, -1.2247, 0, 0]
    adv, _ = ADVANTAGES["reinforce_pp_baseline"](scores=torch.tensor([1.0, 0, 1, 1]),
                                                 response_mask=torch.ones(4, 1), group_size=2)
    s6 = math.sqrt(6)
    torch.testing.assert_close(rows(adv), torch.tensor([0.5 * s6, -0.5 * s6, 0, 0]),
                               atol=1e-5, rtol=0)


def test_discounted_returns_and_reinforce_pp():
    # row 0: rewards [0, 0, 1], gamma 0.5 -> returns [0.25, 0.5, 1]
    # row 1: mask [1, 0, 1] (a masked tool token in the middle is skipped): rewards [0, 9, 1]
    #        -> [0.5, 0, 1] (the 9 is padding garbage and is ignored)
    r = torch.tensor([[0.0, 0, 1], [0, 9, 1]])
    m = torch.tensor([[1, 1, 1], [1, 0, 1]])
    ret = discounted_returns(r, m, gamma=0.5)
    assert torch.equal(ret, torch.tensor([[0.25, 0.5, 1.0], [0.5, 0.0, 1.0]]))
    adv, ret2 = ADVANTAGES["reinforce_pp"](token_rewards=r, response_mask=m, gamma=0.5)
    assert torch.equal(ret2, ret)
    # returns over the 5 real tokens: 0.25, 0.5, 1, 0.5, 1 -> mean 0.65,
    # squared deviations .16 + .0225 + .1225 + .0225 + .1225 = 0.45, unbiased var 0.1125
    std = math.sqrt(0.1125)
    expected = torch.tensor([[-0.4 / std, -0.15 / std, 0.35 / std], [-0.15 / std, 0.0, 0.35 / std]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_gae_hand_worked():
    # gamma 0.9, lam 0.5.
    # row 0: r [0, 0, 1], V [.5, .5, .5]:
    #   t2: delta = 1 + 0 - .5 = .5,          A2 = .5
    #   t1: delta = 0 + .9*.5 - .5 = -.05,    A1 = -.05 + .45*.5 = .175
    #   t0: delta = -.05,                     A0 = -.05 + .45*.175 = .02875
    #   returns = A + V = [.52875, .675, 1.0]
    # row 1: mask [1, 1, 0], r [0, 1, 0], V [.2, .4, 9 (padding garbage, ignored)]:
    #   t1: delta = 1 + 0 - .4 = .6,          A1 = .6
    #   t0: delta = 0 + .9*.4 - .2 = .16,     A0 = .16 + .45*.6 = .43
    #   returns = [.63, 1.0, 0]
    r = torch.tensor([[0.0, 0, 1], [0, 1, 0]])
    v = torch.tensor([[0.5, 0.5, 0.5], [0.2, 0.4, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = ADVANTAGES["gae"](token_rewards=r, values=v, response_mask=m, gamma=0.9, lam=0.5,
                                 whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.02875, 0.175, 0.5], [0.43, 0.6, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.52875, 0.675, 1.0], [0.63, 1.0, 0.0]]))
    # whitened: mean 0, unbiased std 1 over the 5 real tokens, padding 0; returns unchanged
    adv_w, ret_w = ADVANTAGES["gae"](token_rewards=r, values=v, response_mask=m, gamma=0.9,
                                     lam=0.5, whiten=True)
    real = adv_w[m.bool()]
    assert abs(real.mean().item()) < 1e-6 and abs(real.std().item() - 1) < 1e-4
    assert adv_w[1, 2] == 0 and torch.equal(ret_w, ret)


def test_gae_lambda_one_is_return_minus_value():
    # lam = 1, gamma = 1: A_t = (sum of future rewards) - V_t
    r = torch.tensor([[0.0, 2.0, 1.0]])
    v = torch.tensor([[1.0, 0.5, 0.25]])
    adv, ret = ADVANTAGES["gae"](token_rewards=r, values=v, response_mask=torch.ones(1, 3), whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[3 - 1.0, 3 - 0.5, 1 - 0.25]]))
    torch.testing.assert_close(ret, torch.tensor([[3.0, 3.0, 1.0]]))


def test_compute_advantages_drops_unused_inputs_but_not_typos():
    kw = dict(scores=torch.tensor([1.0, 0]), response_mask=torch.ones(2, 1),
              group_index=torch.tensor([0, 0]), values=torch.zeros(2, 1), token_rewards=None)
    adv, _ = compute_advantages("dr_grpo", **kw)
    assert torch.equal(adv[:, 0], torch.tensor([0.5, -0.5]))
    with pytest.raises(TypeError):
        compute_advantages("grpo", norm_by_sdt=False, **kw)
    with pytest.raises(KeyError, match="known"):
        compute_advantages("grpoo", **kw)
    with pytest.raises(ValueError):  # both group_size and group_index
        compute_advantages("grpo", group_size=2, **kw)


def test_return_to_go_skips_a_hole_in_the_mask():
    # multi-turn: turn 1 = tokens 0-1, observation tokens 2-3 (masked), turn 2 = token 4 with
    # the outcome reward 1; gamma 0.5. The hole is not a step: G = [0.25, 0.5, 0, 0, 1].
    # (verl's reinforce_plus_plus would reset at the hole: G = [0, 0, ., ., 1]; OpenRLHF would
    # discount across it: G = [0.0625, 0.125, ., ., 1].) Garbage rewards in the hole are ignored.
    mask = torch.tensor([[1, 1, 0, 0, 1]])
    for hole in (0.0, 9.0):
        r = torch.tensor([[0.0, 0.0, hole, hole, 1.0]])
        assert torch.equal(discounted_returns(r, mask, gamma=0.5),
                           torch.tensor([[0.25, 0.5, 0.0, 0.0, 1.0]]))
    # and the REINFORCE++ advantages whiten over the 3 real tokens only: returns .25, .5, 1 ->
    # mean 0.583333, unbiased var (0.111111 + 0.006944 + 0.173611) / 2 = 0.145833
    adv, _ = ADVANTAGES["reinforce_pp"](token_rewards=torch.tensor([[0.0, 0, 9, 9, 1]]),
                                        response_mask=mask, gamma=0.5)
    m, sd = 1.75 / 3, math.sqrt(0.145833333)
    torch.testing.assert_close(adv, torch.tensor([[(0.25 - m) / sd, (0.5 - m) / sd, 0, 0, (1 - m) / sd]]),
                               atol=1e-5, rtol=0)


def test_gae_skips_a_hole_in_the_mask():
    # gamma 0.9, lam 0.5, mask [1, 0, 1]; the hole holds garbage reward 5 and value 9:
    #   t2: delta = 1 + 0 - 0.25 = 0.75,                 A2 = 0.75
    #   t1: skipped (V_next stays 0.25, A_next stays 0.75)
    #   t0: delta = 0 + 0.9 * 0.25 - 0.5 = -0.275,       A0 = -0.275 + 0.45 * 0.75 = 0.0625
    #   returns = A + V = [0.5625, 0, 1.0]
    adv, ret = ADVANTAGES["gae"](token_rewards=torch.tensor([[0.0, 5.0, 1.0]]),
                                 values=torch.tensor([[0.5, 9.0, 0.25]]),
                                 response_mask=torch.tensor([[1, 0, 1]]), gamma=0.9, lam=0.5,
                                 whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.0625, 0.0, 0.75]]))
    torch.testing.assert_close(ret, torch.tensor([[0.5625, 0.0, 1.0]]))


def test_gae_is_detached_and_float32_for_a_bf16_critic():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(2, 64, generator=g).bfloat16().requires_grad_()
    r = torch.randn(2, 64, generator=g)
    mask = torch.ones(2, 64)
    adv, ret = ADVANTAGES["gae"](token_rewards=r, values=v, response_mask=mask, gamma=0.99,
                                 lam=0.95, whiten=False)
    assert not adv.requires_grad and not ret.requires_grad  # targets must carry no gradient
    assert adv.dtype == ret.dtype == torch.float32
    adv64, _ = ADVANTAGES["gae"](token_rewards=r.double(), values=v.detach().double(),
                                 response_mask=mask, gamma=0.99, lam=0.95, whiten=False)
    torch.testing.assert_close(adv.double(), adv64, atol=1e-5, rtol=0)


def test_remax_subtracts_the_greedy_score():
    # scores [1, 0, 0.5], greedy baselines [0.5, 0.5, 0.5] -> [0.5, -0.5, 0] on every real token
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    adv, ret = compute_advantages("remax", scores=torch.tensor([1.0, 0.0, 0.5]),
                                  baseline_scores=torch.full((3,), 0.5), response_mask=mask,
                                  values=None, group_index=torch.zeros(3))
    assert torch.equal(adv, torch.tensor([[0.5, 0.5, 0], [-0.5, 0, 0], [0, 0, 0]]))
    assert torch.equal(adv, ret)


def test_estimators_declare_what_they_read():
    """The declaration (register_advantage's inputs / hyper) is what the config check and the
    driver read: it must be true to each function's signature."""
    import dataclasses
    import inspect

    from baton.algos.config import AlgoConfig

    keys = {f.name for f in dataclasses.fields(AlgoConfig)}
    for name, fn in ADVANTAGES.items():
        needs, params = estimator_needs(name), inspect.signature(fn).parameters
        assert set(needs.inputs) <= set(params), name
        required = {k for k in ADVANTAGE_INPUTS if k in params and params[k].default is inspect.Parameter.empty}
        assert required <= set(needs.inputs), name
        assert set(needs.hyper) <= set(params) and set(needs.hyper.values()) <= keys, name
    assert [n for n in ADVANTAGES if estimator_needs(n).critic] == ["gae"]
    assert [n for n in ADVANTAGES if estimator_needs(n).baseline] == ["remax"]
    assert estimator_needs("turn_grpo").groups and estimator_needs("grpo").groups
    assert not estimator_needs("reinforce_pp").groups
    assert estimator_needs("gae").hyper == {"gamma": "gamma", "lam": "lam", "whiten": "whiten_advantages"}