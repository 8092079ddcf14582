"""The PPO driver's own pieces, by hand: how rewards combine (functions + weighted reward
model + DAPO overlong penalty), and why truncated IS may scale the advantages instead of the
per-token loss (every policy loss is positively homogeneous in the advantage)."""

import pytest
import torch

from baton import fields as F
from baton.algos import POLICY_LOSSES, actor_loss
from baton.batch import Batch
from types import SimpleNamespace

from baton.trainers.ppo import total_reward
from baton.workers.reward_model import RM_SCORE


def cfg(rm_weight: float, max_len: int = 4, buffer: int = 0, penalty: float = 1.0, scored: bool = True):
    """The keys total_reward reads: reward_model.weight, rollout.max_new_tokens, algo.overlong_*,
    and whether the rows carry a task reward (`PPOConfig.scored`)."""
    return SimpleNamespace(reward_model=SimpleNamespace(weight=rm_weight), rollout=SimpleNamespace(max_new_tokens=max_len),
                           algo=SimpleNamespace(overlong_buffer=buffer, overlong_penalty=penalty), scored=scored)


def test_rewards_combine_by_weight_with_the_overlong_penalty():
    batch = Batch({F.REWARDS: torch.tensor([1.0, 0.0, 1.0]), RM_SCORE: torch.tensor([2.0, -1.0, 0.5]),
                   F.RESPONSE_MASK: torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])})
    out = total_reward(cfg(rm_weight=0.5, max_len=4, buffer=2, penalty=1.0), {"reward_model"}, batch)
    # lengths 1, 3, 4 with max 4, buffer 2: penalties 0, -(3-2)/2 = -0.5, -(4-2)/2 = -1
    assert out["reward/overlong"].tolist() == [0.0, -0.5, -1.0]
    # 1 + 0.5*2 + 0 = 2; 0 + 0.5*(-1) - 0.5 = -1; 1 + 0.5*0.5 - 1 = 0.25
    assert out[F.REWARDS].tolist() == [2.0, -1.0, 0.25]
    assert out["reward_errors"].tolist() == [0, 0, 0]  # failure counts exist without a reward role


def test_reward_model_alone():
    batch = Batch({RM_SCORE: torch.tensor([0.2, -0.4]), F.RESPONSE_MASK: torch.ones(2, 3)})
    roles = {"reward_model"}  # no reward functions, and the source does not score its rows
    assert total_reward(cfg(rm_weight=2.0, scored=False), roles, batch)[F.REWARDS].tolist() == pytest.approx([0.4, -0.8])


@pytest.mark.parametrize("loss,kwargs", [("ppo_clip", {"clip_low": 0.2, "clip_high": 0.28}),
                                         ("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0}),
                                         ("vanilla", {}), ("gspo", {})])
def test_tis_weights_on_the_advantages_equal_tis_weights_on_the_loss(loss, kwargs):
    g = torch.Generator().manual_seed(0)
    B, R = 6, 5
    mask = (torch.arange(R) < torch.tensor([5, 3, 1, 4, 2, 5])[:, None]).float()
    old = -torch.rand(B, R, generator=g)
    logp = (old + 0.3 * torch.randn(B, R, generator=g)).requires_grad_()
    adv = torch.randn(B, 1, generator=g).expand(B, R).clone()
    w = torch.rand(B, R, generator=g) * 2  # [0, 2): the capped weights
    common = dict(old_logprobs=old, response_mask=mask, policy_loss=loss, policy_loss_kwargs=kwargs,
                  agg_mode="token-mean")
    per_token, _ = POLICY_LOSSES[loss](logprobs=logp, old_logprobs=old, advantages=adv, response_mask=mask,
                                       **kwargs)  # [B, R]
    a = (per_token * w * mask).sum() / mask.sum()  # the weights on the loss, token-mean
    (ga,) = torch.autograd.grad(a, logp)
    b, _ = actor_loss(logprobs=logp, advantages=adv * w, **common)
    (gb,) = torch.autograd.grad(b, logp)
    assert a.item() == pytest.approx(b.item(), abs=1e-6)
    assert torch.allclose(ga, gb, atol=1e-6)


def test_a_role_whose_columns_the_rows_carry_is_not_called_again():
    """"Scored" is one fact, the rows' `rewards` column: rows without it are scored by the
    real reward worker; rows that arrive with it (a generator that ran the reward role on its
    own pool, DAPO's sampling) are not scored again (`score_futures`, the declared roles)."""
    from baton.controller import build_role_groups
    from baton.trainers.ppo import score_futures
    from baton.workers.reward import RewardConfig, RewardWorker

    roles = build_role_groups({"main": 1}, {"reward": "main"}, {"reward": (RewardWorker, (RewardConfig(),), {})})
    try:
        rows = Batch(non_tensors={F.PROMPT_TEXT: ["1+1=", "2+2="], F.COMPLETION_TEXT: ["2", "5"],
                                  "answer": ["2", "4"]})
        (future,) = score_futures(SimpleNamespace(), roles, rows)
        scored = rows.union(future.get())
        assert scored[F.REWARDS].tolist() == [1.0, 0.0]
        assert score_futures(SimpleNamespace(), roles, scored) == []
    finally:
        for group in roles.values():
            group.shutdown()


def test_a_role_s_checkpoints_of_pruned_steps_go(tmp_path):
    """The critic's checkpoints (its declared prefix) follow the actor's keep-K: a step the
    actor pruned loses its critic_step_N; other names are left alone."""
    from baton.trainers.ppo import prune
    from baton.trainers.role_specs import ROLES

    prefix = ROLES["critic"].checkpoint
    for name in (f"{prefix}1", f"{prefix}2", f"{prefix}x", "step_2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.pt").write_text("")
    prune(tmp_path, prefix, live={2})
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{prefix}2", f"{prefix}x", "step_2"]
