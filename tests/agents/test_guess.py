"""The guess env (per-turn feedback "higher" / "lower") from the registered task `guess`:
real episodes of a real model, per-turn rewards at each turn's last policy token, and
turn_grpo carrying them into the loss; the recipe runs a GRPO step through the driver."""

from pathlib import Path

import torch

from baton import fields as F
from baton.agents.config import AgentConfig
from baton.agents.rollout import run_episodes
from baton.algos import actor_loss, compute_advantages
from baton.batch import collate
from baton.envs import get_task
from baton.protocol import SamplingParams

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "checkpoints/arith-sft")


def test_guess_prompts_vary_and_split():
    task = get_task("guess")
    train, held = task.train_rows(300), task.eval_rows(20)
    assert len({r["prompt"] for r in train}) > 100
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    for r in held:
        lo, hi = map(int, r["prompt"][:-1].split(".."))
        assert lo <= int(r["answer"]) <= hi


def test_per_turn_rewards_reach_the_loss():
    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.embedded.engine import EmbeddedEngine

    model, tok = load_model(MODEL).eval(), load_tokenizer(MODEL)
    torch.manual_seed(0)
    rows, stats = run_episodes(EmbeddedEngine(model, tok), tok, collate(get_task("guess").train_rows(4, seed=3)), 4,
                               AgentConfig(env="guess", env_args={"suffix": "="}, max_turns=4, max_tokens=48,
                                           turn_max_new_tokens=4), SamplingParams(temperature=1.0, max_new_tokens=4))
    mask, tr = rows[F.RESPONSE_MASK], rows[F.TOKEN_REWARDS]
    assert stats["turns_mean"] > 1 and stats["turn_reward_mean"] > 0
    # every reward sits on a turn's last policy token (the next token is off the policy or the end)
    ends = mask.bool() & ~torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1).bool()
    assert (tr[~ends] == 0).all() and (tr[ends] != 0).any()
    gi = torch.arange(len(rows)) // 4

    def grad(token_rewards):
        adv, _ = compute_advantages("turn_grpo", token_rewards=token_rewards, response_mask=mask, group_index=gi)
        logp = rows[F.ROLLOUT_LOGPROBS].clone().requires_grad_(True)
        actor_loss(logprobs=logp, old_logprobs=rows[F.ROLLOUT_LOGPROBS], advantages=adv, response_mask=mask)[0].backward()
        return logp.grad

    # drop the per-turn rewards (keep each trajectory's final reward at its last token): the
    # gradient on the policy's tokens changes, so the per-turn rewards reach the loss
    last = torch.zeros_like(tr)
    idx = torch.arange(mask.shape[1]).expand_as(mask).masked_fill(mask == 0, -1).max(1).values
    last[torch.arange(len(rows)), idx] = 1.0
    g_all, g_final = grad(tr), grad(tr * last)
    assert not torch.allclose(g_all[mask == 1], g_final[mask == 1])
    assert (g_all[mask == 0] == 0).all()


def test_guess_recipe_runs_a_step(tmp_path):
    from baton.config import load_config
    from baton.metrics import read_metrics
    from baton.trainers.ppo import train
    from baton.trainers.ppo_config import PPOConfig

    cfg = load_config(PPOConfig, REPO / "recipes/agent_guess.yaml",
                      [f"trainer.run_dir={tmp_path}", "trainer.steps=1", f"model.path={MODEL}",
                       "data.prompts_per_step=4", "rollout.n=4", "data.eval_size=4", "actor.mini_batch_size=0",
                       "actor.micro_batch_size=16", "trainer.progress=false"])
    train(cfg)
    step = [r for r in read_metrics(tmp_path) if r.get("step") == 1 and "actor/loss" in r][0]
    assert step["agent/turns_mean"] > 1 and step["agent/turn_reward_mean"] > 0
    assert step["actor/approx_kl"] < 1e-3
