"""Off-policy corrections by name (tis, decoupled_ppo), by hand, and the identity the GRPO
driver relies on: the weights applied to the advantages give the decoupled PPO loss."""

import math

import pytest
import torch

from baton.algos import OFF_POLICY, decoupled_ppo_loss, ppo_clip_loss
from baton.algos.config import AlgoConfig, check_algo_names, check_algo_ranges

LN = math.log
# one row, 3 response positions, the last one padding (its garbage must not matter):
#   pi_prox = [0.5, 0.2 | .], mu = [0.25, 0.4 | .]  ->  pi_prox / mu = [2, 0.5 | .]
PROX = torch.tensor([[LN(0.5), LN(0.2), 40.0]])
MU = torch.tensor([[LN(0.25), LN(0.4), -40.0]])
MASK = torch.tensor([[1, 1, 0]])


def test_weights_by_hand():
    # cap 1.5: tis truncates 2 -> 1.5; decoupled_ppo drops that token (w = 0); padding w = 1
    w, m = OFF_POLICY["tis"](PROX, MU, MASK, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.5, 1.0]]))
    assert m["off_policy/capped_frac"].item() == pytest.approx(0.5)
    assert m["off_policy/weight_mean"].item() == pytest.approx((1.5 + 0.5) / 2)
    # k3 of KL(mu || pi_prox) = mean(r - 1 - ln r) = ((2 - 1 - ln 2) + (0.5 - 1 + ln 2)) / 2 = 0.25
    assert m["off_policy/mismatch_kl"].item() == pytest.approx(0.25, rel=1e-6)
    w, m = OFF_POLICY["decoupled_ppo"](PROX, MU, MASK, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.5, 1.0]]))
    assert m["off_policy/weight_mean"].item() == pytest.approx(0.25)
    w, m = OFF_POLICY["none"](PROX, MU, MASK, cap=1.5)
    assert w is None and m["off_policy/mismatch_kl"].item() == pytest.approx(0.25, rel=1e-6)


def test_decoupled_ppo_loss_by_hand():
    # pi_theta = [0.6, 0.3]: r = pi_theta / pi_prox = [1.2, 1.5]; A = [1, -1]; clip [0.8, 1.28]
    #   token 1: max(-1 * 1.2, -1 * clip(1.2)) = -1.2;     weight 2   -> -2.4
    #   token 2: max(1 * 1.5, 1 * clip(1.5) = 1.28) = 1.5; weight 0.5 -> 0.75
    theta = torch.tensor([[LN(0.6), LN(0.3), 7.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 0.0]])
    kw = dict(logprobs=theta, proximal_logprobs=PROX, behaviour_logprobs=MU, advantages=adv,
              response_mask=MASK, clip_low=0.2, clip_high=0.28)
    loss, m = decoupled_ppo_loss(**kw, cap=2.5)
    torch.testing.assert_close(loss, torch.tensor([[-2.4, 0.75, 0.0]]), atol=1e-6, rtol=0)
    # gradients flow through pi_theta only, w * -A * r per token (neither term is clipped:
    # token 2 has A < 0 and r above the range, where the unclipped loss is the larger)
    #   token 1: 2 * -1 * 1.2 = -2.4;  token 2: 0.5 * 1 * 1.5 = 0.75
    loss.sum().backward()
    torch.testing.assert_close(theta.grad, torch.tensor([[-2.4, 0.75, 0.0]]), atol=1e-6, rtol=0)
    loss, _ = decoupled_ppo_loss(**kw, cap=1.5)  # token 1's behaviour weight 2 > cap: dropped
    torch.testing.assert_close(loss, torch.tensor([[0.0, 0.75, 0.0]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["tis", "decoupled_ppo"])
def test_weights_on_the_advantages_equal_weights_on_the_loss(name):
    """What the driver does (scale A by w, keep the actor's ppo_clip against pi_prox) is the
    weighted objective, token by token: w >= 0 and detached."""
    g = torch.Generator().manual_seed(0)
    prox, mu = torch.randn(6, 5, generator=g) - 1, torch.randn(6, 5, generator=g) - 1
    theta = prox + 0.3 * torch.randn(6, 5, generator=g)
    adv, mask = torch.randn(6, 5, generator=g), (torch.rand(6, 5, generator=g) > 0.2).long()
    w, _ = OFF_POLICY[name](prox, mu, mask, cap=2.0)
    scaled, _ = ppo_clip_loss(logprobs=theta, old_logprobs=prox, advantages=adv * w, response_mask=mask,
                              clip_low=0.2, clip_high=0.28)
    if name == "decoupled_ppo":
        direct, _ = decoupled_ppo_loss(logprobs=theta, proximal_logprobs=prox, behaviour_logprobs=mu,
                                       advantages=adv, response_mask=mask, clip_low=0.2, clip_high=0.28, cap=2.0)
    else:
        plain, _ = ppo_clip_loss(logprobs=theta, old_logprobs=prox, advantages=adv, response_mask=mask,
                                 clip_low=0.2, clip_high=0.28)
        direct = plain * w
    torch.testing.assert_close(scaled, direct)


def test_config_names_and_ranges():
    check_algo_names(AlgoConfig(advantage="grpo", off_policy="decoupled_ppo"))
    with pytest.raises(ValueError, match="algo.off_policy='areal' is not one of"):
        check_algo_names(AlgoConfig(advantage="grpo", off_policy="areal"))
    with pytest.raises(ValueError, match="off_policy_cap must be >= 1"):
        check_algo_ranges(AlgoConfig(off_policy_cap=0.5))
