"""PPO clip (both sides, clip-higher asymmetry, dual-clip), vanilla PG and the value loss."""

import math

import pytest
import torch

from baton.algos import POLICY_LOSSES, value_loss


def ppo(ratios, advs, **kw):
    """Per-token PPO loss for 1-row inputs given as ratios; returns (loss, grad wrt logprobs, metrics)."""
    logp = torch.log(torch.tensor([ratios], dtype=torch.float64)).requires_grad_()  # old = 0
    loss, metrics = POLICY_LOSSES["ppo_clip"](
        logprobs=logp, old_logprobs=torch.zeros_like(logp), advantages=torch.tensor([advs], dtype=torch.float64),
        response_mask=torch.ones(1, len(ratios)), **kw)
    loss.sum().backward()
    return loss.detach()[0].tolist(), logp.grad[0].tolist(), metrics


def test_ppo_clip_both_sides_symmetric():
    # eps 0.2. token: (ratio, A) -> loss = max(-A r, -A clip(r, .8, 1.2))
    #   (1.5, +1): max(-1.5, -1.2) = -1.2  clipped (no gradient)
    #   (0.5, +1): max(-0.5, -0.8) = -0.5  unclipped, d/dlogp = -A r = -0.5
    #   (0.5, -1): max( 0.5,  0.8) =  0.8  clipped
    #   (1.5, -1): max( 1.5,  1.2) =  1.5  unclipped, grad = -A r = 1.5
    #   (1.1, +1): inside the range = -1.1, grad -1.1
    loss, grad, m = ppo([1.5, 0.5, 0.5, 1.5, 1.1], [1, 1, -1, -1, 1], clip_low=0.2)
    assert loss == pytest.approx([-1.2, -0.5, 0.8, 1.5, -1.1])
    assert grad == pytest.approx([0.0, -0.5, 0.0, 1.5, -1.1])
    assert m["clip_frac"].item() == pytest.approx(2 / 5)
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 0.5 + 1.5 + 1.1) / 5)


def test_ppo_clip_higher_asymmetry():
    # clip_low 0.2, clip_high 0.28 -> range [0.8, 1.28]
    #   (1.25, +1): inside [.8, 1.28] -> -1.25 (symmetric 0.2 would clip to -1.2)
    #   (1.5,  +1): clipped at 1.28 -> -1.28
    #   (0.75, -1): clipped at 0.8 -> 0.8 (the low side is unchanged)
    loss, grad, m = ppo([1.25, 1.5, 0.75], [1, 1, -1], clip_low=0.2, clip_high=0.28)
    assert loss == pytest.approx([-1.25, -1.28, 0.8])
    assert grad == pytest.approx([-1.25, 0.0, 0.0])
    assert m["clip_frac"].item() == pytest.approx(2 / 3)
    sym, _, _ = ppo([1.25], [1], clip_low=0.2)
    assert sym == pytest.approx([-1.2])


def test_ppo_dual_clip():
    # c = 3, eps 0.2:
    #   (5, -1): standard max(5, 1.2) = 5, capped at -A c = 3 -> 3, no gradient
    #   (2, -1): standard 2 < 3 -> 2, gradient -A r = 2
    #   (5, +1): A > 0 is never dual-clipped -> max(-5, -1.2) = -1.2
    loss, grad, m = ppo([5.0, 2.0, 5.0], [-1, -1, 1], clip_low=0.2, dual_clip=3.0)
    assert loss == pytest.approx([3.0, 2.0, -1.2])
    assert grad == pytest.approx([0.0, 2.0, 0.0])
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        ppo([1.0], [1], dual_clip=0.9)


def test_ppo_metrics_and_padding():
    # approx_kl = mean(r - 1 - log r) over real tokens; r = 2 -> 1 - ln 2 = 0.30685; r = 1 -> 0
    logp = torch.tensor([[math.log(2.0), 0.0, 50.0]])  # last token is padding (garbage)
    loss, m = POLICY_LOSSES["ppo_clip"](logprobs=logp, old_logprobs=torch.zeros(1, 3),
                                        advantages=torch.ones(1, 3), response_mask=torch.tensor([[1, 1, 0]]))
    assert m["approx_kl"].item() == pytest.approx((1 - math.log(2)) / 2, rel=1e-6)
    assert m["ratio_mean"].item() == pytest.approx(1.5)
    assert loss[0, 2] == 0 and torch.isfinite(loss).all()


def test_vanilla_gradient_is_reinforce():
    # old == current: d(-A r)/dlogp = -A at r = 1
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = POLICY_LOSSES["vanilla"](logprobs=logp, old_logprobs=logp.detach(),
                                       advantages=torch.tensor([[2.0, -3.0]]), response_mask=torch.ones(1, 2))
    assert loss.tolist() == [[-2.0, 3.0]]  # -A * 1
    loss.sum().backward()
    assert logp.grad.tolist() == [[-2.0, 3.0]]


def test_value_loss_clipped():
    # returns 1, old value 0, clip 0.2:
    #   V = 0.5: unclipped 0.5 * 0.25 = 0.125; clipped V -> 0.2: 0.5 * 0.64 = 0.32 -> max 0.32
    #   V = 0.1: inside the clip range -> 0.5 * 0.81 = 0.405 both ways
    v = torch.tensor([[0.5, 0.1]])
    loss, m = value_loss(values=v, old_values=torch.zeros(1, 2), returns=torch.ones(1, 2),
                         response_mask=torch.ones(1, 2), clip_range=0.2)
    torch.testing.assert_close(loss, torch.tensor([[0.32, 0.405]]))
    assert m["value_clip_frac"].item() == 0.5
    loss, _ = value_loss(values=v, old_values=torch.zeros(1, 2), returns=torch.ones(1, 2),
                         response_mask=torch.ones(1, 2))
    torch.testing.assert_close(loss, torch.tensor([[0.125, 0.405]]))
