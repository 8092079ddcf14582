"""Truncated importance sampling against the engine's behaviour logprobs."""

import math

import pytest
import torch

from baton.algos import truncated_is_weights


def test_tis_weights_hand_worked():
    # old - rollout = [ln 3, ln 0.5, 0 | padding garbage 50]; cap 2:
    #   ratios [3, 0.5, 1] -> weights [2 (capped), 0.5, 1], padding weight 1
    #   capped frac 1/3; weight mean (2 + 0.5 + 1) / 3 = 7/6
    #   mismatch KL (k3 of KL(rollout || old)) = mean(r - 1 - ln r)
    #     = ((3 - 1 - ln 3) + (0.5 - 1 + ln 2) + 0) / 3 = (0.901388 + 0.193147) / 3 = 0.364845
    old = torch.tensor([[math.log(3), math.log(0.5), -1.0, 50.0]], requires_grad=True)
    rollout = torch.tensor([[0.0, 0.0, -1.0, 0.0]])
    w, m = truncated_is_weights(old, rollout, torch.tensor([[1, 1, 1, 0]]), cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0, 1.0]]))
    assert not w.requires_grad
    assert m["rollout/tis_capped_frac"].item() == pytest.approx(1 / 3)
    assert m["rollout/tis_weight_mean"].item() == pytest.approx(7 / 6)
    expected_kl = ((2 - math.log(3)) + (-0.5 + math.log(2))) / 3
    assert m["rollout/logprob_mismatch_kl"].item() == pytest.approx(expected_kl, rel=1e-5)


def test_tis_identical_logprobs_give_unit_weights_and_zero_kl():
    lp = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    w, m = truncated_is_weights(lp, lp.clone(), torch.ones(3, 5))
    assert torch.equal(w, torch.ones(3, 5))
    assert m["rollout/tis_capped_frac"].item() == 0 and m["rollout/logprob_mismatch_kl"].item() == 0
