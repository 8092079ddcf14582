"""Critic: clipped value loss (and its clip fraction), aggregation, explained variance."""

import pytest
import torch

from baton.algos import critic_loss, explained_variance, loss_normalisers, value_loss


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


def test_clip_toward_the_return_is_not_counted():
    # V = -0.5, old 0, R = -1, clip 0.2: clip(V) = -0.2 -> (0.8)^2 = 0.64 > (0.5)^2 = 0.25 -> chosen
    # V = 0.5, old 0, R = 0.1: clip(V) = 0.2 -> (0.1)^2 = 0.01 < (0.4)^2 = 0.16 -> unclipped term
    #   chosen even though V was clipped: loss 0.5 * 0.16 = 0.08, not counted
    loss, m = value_loss(values=torch.tensor([[-0.5, 0.5]]), old_values=torch.zeros(1, 2),
                         returns=torch.tensor([[-1.0, 0.1]]), response_mask=torch.ones(1, 2),
                         clip_range=0.2)
    torch.testing.assert_close(loss, torch.tensor([[0.32, 0.08]]))
    assert m["value_clip_frac"].item() == 0.5


def test_clipfrac_is_exactly_zero_when_nothing_is_clipped():
    # |V - V_old| = 0.13 < 0.2 on every token, so no token is clipped and clipfrac must be 0.
    # These float32 values are the ones where V_old + (V - V_old) != V (the old formula):
    #   0.04 + (0.17 - 0.04) rounds away from 0.17 and (clip - R)^2 > (V - R)^2 by one ulp.
    v = torch.tensor([[0.17, -0.09, 0.09, -0.04]])
    old = torch.tensor([[0.04, 0.04, -0.04, 0.09]])
    ret = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    assert (old + (v - old).clamp(-0.2, 0.2) != v).any()  # the rounding really happens here
    loss, m = value_loss(values=v, old_values=old, returns=ret, response_mask=torch.ones(1, 4),
                         clip_range=0.2)
    assert m["value_clip_frac"].item() == 0.0
    assert torch.equal(loss, 0.5 * (v - ret) ** 2)
    # and on many random unclipped float32 tokens (values of different signs / magnitudes)
    g = torch.Generator().manual_seed(0)
    old = torch.randn(10_000, generator=g) * 0.3
    v = old + (torch.rand(10_000, generator=g) * 2 - 1) * 0.19
    v = torch.where((v - old).abs() < 0.19, v, old)[None]  # [1, N], strictly inside
    _, m = value_loss(values=v, old_values=old[None], returns=torch.randn(1, 10_000, generator=g),
                      response_mask=torch.ones(1, 10_000), clip_range=0.2)
    assert m["value_clip_frac"].item() == 0.0


def test_critic_loss_aggregates_with_global_normalisers():
    # unclipped, per token 0.5 (V - R)^2: row 0 V [1, 2] R 0 -> [0.5, 2]; row 1 V [3, garbage]
    # mask [[1, 1], [1, 0]] -> [4.5, 0]
    #   token-mean: (0.5 + 2 + 4.5) / 3 = 7/3; with 6 global tokens: 7/6
    #   seq-mean-token-mean: (1.25 + 4.5) / 2 = 2.875
    #   seq-mean-token-sum: (2.5 + 4.5) / 2 = 3.5; with 4 global seqs: 1.75
    v = torch.tensor([[1.0, 2.0], [3.0, float("nan")]])
    kw = dict(values=v, old_values=torch.zeros(2, 2), returns=torch.zeros(2, 2),
              response_mask=torch.tensor([[1, 1], [1, 0]]))
    loss, m = critic_loss(**kw)
    assert loss.item() == pytest.approx(7 / 3) and m["value_loss"].item() == pytest.approx(7 / 3)
    assert critic_loss(**kw, global_tokens=6)[0].item() == pytest.approx(7 / 6)
    assert critic_loss(**kw, agg_mode="seq-mean-token-mean")[0].item() == pytest.approx(2.875)
    assert critic_loss(**kw, agg_mode="seq-mean-token-sum")[0].item() == pytest.approx(3.5)
    assert critic_loss(**kw, agg_mode="seq-mean-token-sum", global_seqs=4)[0].item() == 1.75
    assert m["value_mean"].item() == pytest.approx(2.0)


def test_critic_gradient_invariant_to_micro_batching():
    g = torch.Generator().manual_seed(1)
    lengths = [3, 1, 4, 2]
    mask = (torch.arange(4) < torch.tensor(lengths)[:, None]).long()  # [4, 4]
    x, w0 = torch.randn(4, 4, 3, generator=g), torch.randn(3, generator=g)
    old, ret = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    tokens, seqs = loss_normalisers(mask)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        def grad(rows):
            w = w0.clone().requires_grad_()
            loss, _ = critic_loss(values=x[rows] @ w, old_values=old[rows], returns=ret[rows],
                                  response_mask=mask[rows], clip_range=0.5, agg_mode=mode,
                                  global_tokens=tokens, global_seqs=seqs)
            loss.backward()
            return w.grad
        full = grad([0, 1, 2, 3])
        torch.testing.assert_close(sum(grad([i]) for i in range(4)), full, atol=1e-6, rtol=0)
        torch.testing.assert_close(grad([0, 1]) + grad([2, 3]), full, atol=1e-6, rtol=0)


def test_explained_variance():
    # returns [1, 2, 3, 4] (padding 9 ignored): unbiased var 5/3
    #   perfect values -> 1; values = mean 2.5 -> var(R - V) = var(R) -> ~0
    #   values [2, 1, 4, 3]: R - V = [-1, 1, -1, 1], var 4/3 -> 1 - (4/3) / (5/3 + 1e-5) = 0.2000
    ret = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert explained_variance(ret, ret, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, 2.5), ret, mask).item() == pytest.approx(0, abs=1e-4)
    v = torch.tensor([[2.0, 1.0, 4.0], [3.0, 0.0, 0.0]])
    assert explained_variance(v, ret, mask).item() == pytest.approx(1 - (4 / 3) / (5 / 3 + 1e-5))
