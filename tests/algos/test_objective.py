"""actor_loss composes policy loss + kl_coef * KL - entropy_coef * entropy, then aggregates."""

import math

import pytest
import torch

from baton.algos import actor_loss


def test_actor_loss_hand_worked():
    # 2 real tokens, ratio 1 (logp == old), A = [1, -2] -> pg = [-1, 2]
    # ref: d = logp - ref = [ln 2, 0] -> k3 = [0.5 + ln 2 - 1, 0] = [0.193147, 0]
    # entropy [1, 3]; per token = pg + 0.5 k3 - 0.1 H = [-1 + 0.096574 - 0.1, 2 - 0.3]
    # token-mean over 2 tokens = (-1.003426 + 1.7) / 2 = 0.348287
    logp = torch.tensor([[math.log(0.5), math.log(0.5), 0.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), 0.0]])
    loss, m = actor_loss(logprobs=logp, old_logprobs=logp, advantages=torch.tensor([[1.0, -2.0, 5.0]]),
                         response_mask=torch.tensor([[1, 1, 0]]), ref_logprobs=ref,
                         entropy=torch.tensor([[1.0, 3.0, 9.0]]), kl_coef=0.5, entropy_coef=0.1)
    k3 = 0.5 + math.log(2) - 1
    assert loss.item() == pytest.approx((-1 + 0.5 * k3 - 0.1 + 2 - 0.3) / 2, rel=1e-6)
    assert m["pg_loss"].item() == pytest.approx(0.5)
    assert m["kl"].item() == pytest.approx(k3 / 2, rel=1e-5)
    assert m["entropy"].item() == pytest.approx(2.0)
    assert m["clip_frac"].item() == 0
    # global normalisers scale the loss, not the metrics (metrics describe this micro-batch)
    loss4, m4 = actor_loss(logprobs=logp, old_logprobs=logp, advantages=torch.tensor([[1.0, -2.0, 5.0]]),
                           response_mask=torch.tensor([[1, 1, 0]]), global_tokens=4)
    assert loss4.item() == pytest.approx(0.25) and m4["pg_loss"].item() == pytest.approx(0.5)


def test_actor_loss_requires_inputs_for_its_terms():
    t = torch.zeros(1, 2)
    kw = dict(logprobs=t, old_logprobs=t, advantages=t, response_mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="ref_logprobs"):
        actor_loss(kl_coef=0.1, **kw)
    with pytest.raises(ValueError, match="entropy"):
        actor_loss(entropy_coef=0.1, **kw)


def test_tis_weights_on_the_advantages_scale_the_policy_term_only():
    # as above, with TIS weights [2, 0.5 | padding 7] on the advantages (where the driver puts
    # them): pg [-1, 2] -> [-2, 1]; the KL and entropy terms are not weighted: per token
    # [-2 + 0.096574 - 0.1, 1 - 0.3] -> token-mean over 2
    logp = torch.tensor([[math.log(0.5), math.log(0.5), 0.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), 0.0]])
    kw = dict(logprobs=logp, old_logprobs=logp, advantages=torch.tensor([[1.0, -2.0, 5.0]]),
              response_mask=torch.tensor([[1, 1, 0]]), ref_logprobs=ref,
              entropy=torch.tensor([[1.0, 3.0, 9.0]]), kl_coef=0.5, entropy_coef=0.1)
    loss, m = actor_loss(**{**kw, "advantages": kw["advantages"] * torch.tensor([[2.0, 0.5, 7.0]])})
    k3 = 0.5 + math.log(2) - 1
    assert loss.item() == pytest.approx((-2 + 0.5 * k3 - 0.1 + 1 - 0.3) / 2, rel=1e-6)
    assert m["pg_loss"].item() == pytest.approx(-0.5)
    # weights of 1 change nothing
    assert actor_loss(**{**kw, "advantages": kw["advantages"] * torch.ones(1, 3)})[0].item() == actor_loss(**kw)[0].item()
