"""Agent and gateway rows through the PPO-family driver: the observation tokens inside a
response (tool output, environment feedback, the template's turn delta) have response
mask 0, and the actor's loss sends them no gradient; the policy's own tokens get one.

Observed in the real update: a hook on the logprobs the actor's loss reads
(ActorWorker._loss -> response_logprobs) records dLoss/dlogp_t [B, R]. Hand-worked: the
loss is sum_t mask_t * l_t(logp_t) / N (token-mean), so dLoss/dlogp_t = mask_t * l'_t / N:
exactly 0 where the mask is 0, and -A_t / N (ratio 1 at the first step) where it is 1. With
a k1 KL term in the loss (kl_coef c: l_t += c (logp_t - ref_t)) every policy token also gets
c / N, so a loss that counted the holes would give them c / N too, even where their
advantage is 0 (as the estimators leave it). An off-by-one or dropped mask gives the holes a
gradient.
"""

from __future__ import annotations


import pytest
import torch

from baton import fields as F
from baton.config import load_config
from baton.trainers import ppo
from baton.trainers.ppo_config import PPOConfig
from baton.workers import actor as actor_module

from .harness import REPO

RECIPE = REPO / "recipes/agent_calculator.yaml"
GUESS = REPO / "recipes/agent_guess.yaml"  # every wrong guess is answered "higher=" / "lower=": an observation
# 16 episodes / sessions: some answer wrong first (the gateway's sessions interleave, so which
# ones varies run to run; with ~half right, all 16 right is ~1e-5)
SMALL = ["data.prompts_per_step=8", "rollout.n=2", "data.eval_size=2", "actor.mini_batch_size=0",
         "actor.micro_batch_size=16", "trainer.progress=false", "trainer.steps=1", "trainer.eval_every=0"]
GATEWAY = ["data.source=gateway", "gateway.agent=openai_agent:solve", "agent=null", "data.task=arithmetic",
           "model.path=checkpoints/arith-sft"]


def grads_of_the_loss(monkeypatch) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(mask, advantages, dLoss/dlogp) [B, R] of each micro-batch the actor's loss reads (in the
    update's own row order: it shuffles whole groups)."""
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    real = actor_module.response_logprobs

    def response_logprobs(model, micro, *args, **kwargs):
        logp, ent = real(model, micro, *args, **kwargs)
        if logp.requires_grad:
            mask, adv = micro[F.RESPONSE_MASK].float(), micro[F.ADVANTAGES]
            logp.register_hook(lambda g: seen.append((mask, adv, g.detach().clone())))
        return logp, ent

    monkeypatch.setattr(actor_module, "response_logprobs", response_logprobs)
    return seen


def holes(mask: torch.Tensor) -> torch.Tensor:
    """[B, R] positions with mask 0 before the row's last policy token (observation tokens)."""
    pos = torch.arange(mask.shape[1])
    last = torch.where(mask.bool(), pos, -1).amax(-1, keepdim=True)
    return (mask == 0) & (pos < last)


KL = ["algo.kl_coef=0.5", "algo.kl_estimator=k1"]
KL_COEF = 0.5


def check_no_gradient_on_observations(grads) -> None:
    (mask, adv, g), = grads  # one micro-batch (micro_batch_size covers the step's rows)
    h = holes(mask)
    assert h.any(), ("no episode had an observation inside it: nothing was checked", mask)
    assert (g[h] == 0).all(), "observation tokens got a gradient"
    assert (g[mask == 0] == 0).all()
    live = mask > 0
    # dLoss/dlogp_t = (-A_t + c) / N on the policy's tokens (ratio 1, token-mean over N real tokens)
    assert torch.allclose(g[live], (-adv[live] + KL_COEF) / mask.sum(), rtol=1e-4, atol=1e-9)


def test_agent_episode_observations_get_no_gradient(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the recipe's model path
    grads = grads_of_the_loss(monkeypatch)
    ppo.train(load_config(PPOConfig, GUESS, [f"trainer.run_dir={tmp_path}", *SMALL, *KL]))
    check_no_gradient_on_observations(grads)


def test_gateway_session_observations_get_no_gradient(tmp_path, monkeypatch):
    pytest.importorskip("openai")
    monkeypatch.syspath_prepend(str(REPO / "tests" / "agents"))  # openai_agent
    monkeypatch.chdir(REPO)
    grads = grads_of_the_loss(monkeypatch)
    ppo.train(load_config(PPOConfig, RECIPE, [f"trainer.run_dir={tmp_path}", *SMALL, *GATEWAY, *KL]))
    check_no_gradient_on_observations(grads)
