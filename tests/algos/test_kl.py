"""KL estimators: hand-worked values, and the documented expectation/gradient properties."""

import math

import pytest
import torch

from baton.algos import KL_ESTIMATORS, kl_penalty


def test_hand_worked():
    # p = 0.5, ref = 0.25: d = ln 2 = 0.693147
    #   k1 = 0.693147, k2 = 0.5 * 0.480453 = 0.240227, k3 = e^{-ln 2} + ln 2 - 1 = 0.193147
    lp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(math.log(2), rel=1e-6)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2, rel=1e-6)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(0.5 + math.log(2) - 1, rel=1e-5)
    # reversed (policy less likely than ref): d = -ln 2 -> k1 < 0 but k2, k3 >= 0
    #   k3 = e^{ln 2} - ln 2 - 1 = 0.306853
    assert kl_penalty(ref, lp, "k1").item() < 0
    assert kl_penalty(ref, lp, "k3").item() == pytest.approx(2 - math.log(2) - 1, rel=1e-5)
    # abs: |d| = ln 2 both ways round
    assert kl_penalty(lp, ref, "abs").item() == pytest.approx(math.log(2), rel=1e-6)
    assert kl_penalty(ref, lp, "abs").item() == pytest.approx(math.log(2), rel=1e-6)
    for name in KL_ESTIMATORS:
        assert kl_penalty(lp, lp, name).item() == 0


def test_k3_is_finite_for_impossible_tokens():
    assert torch.isfinite(kl_penalty(torch.tensor([[-0.1]]), torch.tensor([[-1e4]]), "k3")).all()
    assert torch.isfinite(kl_penalty(torch.tensor([[-1e4]]), torch.tensor([[-0.1]]), "k3")).all()


def _categorical():
    theta = torch.tensor([0.3, -1.0, 0.8, 0.1], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.5, -0.5, 1.0], dtype=torch.float64), -1)
    return theta, ref


def test_k1_k3_are_unbiased_and_the_gradients_are_as_documented():
    """Exact expectations over a 4-way categorical: sum_x pi(x) * k(x) with pi(x) a constant
    weight (the samples are fixed data, as in training)."""
    theta, ref = _categorical()
    logp = torch.log_softmax(theta, -1)
    pi = logp.exp().detach()
    reverse_kl = (logp.exp() * (logp - ref)).sum()  # KL(pi || ref)
    forward_kl = (ref.exp() * (ref - logp)).sum()  # KL(ref || pi)

    for name in ("k1", "k3"):  # unbiased values
        assert (pi * kl_penalty(logp, ref, name)).sum().item() == pytest.approx(reverse_kl.item())

    def grad(f):
        (g,) = torch.autograd.grad(f(), theta, retain_graph=True)
        return g

    expected = {"k1": torch.zeros(4, dtype=torch.float64), "k2": grad(lambda: reverse_kl),
                "k3": grad(lambda: forward_kl)}
    for name, g in expected.items():
        got = grad(lambda: (pi * kl_penalty(logp, ref, name)).sum())
        torch.testing.assert_close(got, g, atol=1e-12, rtol=0, msg=name)
