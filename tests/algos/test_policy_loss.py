"""PPO clip (both sides, clip-higher asymmetry, dual-clip), vanilla PG, GSPO (value loss: test_value)."""

import math

import pytest
import torch

from baton.algos import POLICY_LOSSES


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


def test_gspo_hand_worked():
    # clip 0.2 both sides. Row 0: log ratios [ln 2, 0] -> sequence ratio exp(ln 2 / 2) = sqrt 2
    #   = 1.41421 on both tokens; A = +1 -> clipped: loss -1.2 on both, no gradient (per-token
    #   PPO would leave the second token, ratio 1, unclipped).
    # Row 1: log ratios [ln 1.1, ln 1.1, padding] -> s = 1.1, A = -1 -> inside: loss 1.1 on the
    #   real tokens, gradient d(-A s_i,t)/dlogp_t = -A s = 1.1; padding 0 and no gradient.
    logp = torch.tensor([[math.log(2), 0.0, 0.0], [math.log(1.1), math.log(1.1), float("-inf")]],
                        dtype=torch.float64, requires_grad=True)
    loss, m = POLICY_LOSSES["gspo"](logprobs=logp, old_logprobs=torch.zeros(2, 3, dtype=torch.float64),
                                    advantages=torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64),
                                    response_mask=torch.tensor([[1, 1, 0], [1, 1, 0]]),
                                    clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(loss.detach(), torch.tensor([[-1.2, -1.2, 0], [1.1, 1.1, 0]], dtype=torch.float64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0, 0], [1.1, 1.1, 0]], dtype=torch.float64))
    assert m["clip_frac"].item() == pytest.approx(0.5)  # the 2 tokens of row 0 out of 4
    assert m["ratio_mean"].item() == pytest.approx((math.sqrt(2) + 1.1) / 2)


def test_gspo_default_clip_is_the_papers_tiny_range():
    # s = exp(0.001) = 1.0010005 > 1 + 4e-4 -> clipped at 1.0004 (A = 1 -> loss -1.0004)
    logp = torch.full((1, 2), 0.001, dtype=torch.float64)
    loss, m = POLICY_LOSSES["gspo"](logprobs=logp, old_logprobs=torch.zeros_like(logp),
                                    advantages=torch.ones_like(logp), response_mask=torch.ones(1, 2))
    assert loss[0].tolist() == pytest.approx([-1.0004, -1.0004]) and m["clip_frac"].item() == 1


def test_gspo_gradient_is_the_sequence_level_gradient():
    """Per-token GSPO aggregated with seq-mean-token-mean has exactly the gradient of the
    sequence objective mean_i -A_i exp(mean_t (logp - old)) (no clipping at this range)."""
    from baton.algos import aggregate_loss
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    old = torch.randn(3, 4, generator=g, dtype=torch.float64)
    logp0 = old + 0.05 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)[:, None].expand(3, 4)
    logp = logp0.clone().requires_grad_()
    per_tok, _ = POLICY_LOSSES["gspo"](logprobs=logp, old_logprobs=old, advantages=adv,
                                       response_mask=mask, clip_low=10.0, clip_high=10.0)
    aggregate_loss(per_tok, mask, "seq-mean-token-mean").backward()
    logp2 = logp0.clone().requires_grad_()
    seq_ratio = torch.exp(((logp2 - old) * mask).sum(-1) / mask.sum(-1))  # [B]
    (-adv[:, 0] * seq_ratio).mean().backward()
    torch.testing.assert_close(logp.grad, logp2.grad, atol=1e-12, rtol=0)


def test_a_policy_loss_declares_the_config_keys_it_is_given():
    """The trainer passes a loss the `algo.*` keys it declares (ppo_clip: its clip range; gspo:
    none, its own paper defaults), and the config refuses them set with a loss that reads none."""
    from types import SimpleNamespace

    from baton.algos.config import AlgoConfig, check_algo_dependencies
    from baton.algos.policy_loss import POLICY_LOSS_HYPER, POLICY_LOSSES, policy_loss_args, register_policy_loss

    algo = SimpleNamespace(clip_low=0.1, clip_high=0.3, dual_clip=None, policy_loss="ppo_clip")
    assert policy_loss_args("ppo_clip", algo) == {"clip_low": 0.1, "clip_high": 0.3, "dual_clip": None}
    assert policy_loss_args("gspo", algo) == {} and policy_loss_args("vanilla", algo) == {}

    @register_policy_loss("clipped_vanilla_test", hyper={"cap": "clip_high"})
    def clipped(*, logprobs, old_logprobs, advantages, response_mask, cap):
        return (-advantages * logprobs).clamp(max=cap) * response_mask, {}

    try:
        assert policy_loss_args("clipped_vanilla_test", algo) == {"cap": 0.3}
        check_algo_dependencies(AlgoConfig(advantage="grpo", policy_loss="clipped_vanilla_test", clip_high=0.3))  # read: accepted
        with pytest.raises(ValueError, match="clip_low"):
            check_algo_dependencies(AlgoConfig(advantage="grpo", policy_loss="clipped_vanilla_test", clip_low=0.1))
    finally:
        dict.pop(POLICY_LOSSES, "clipped_vanilla_test")
        POLICY_LOSS_HYPER.pop("clipped_vanilla_test")
