"""`data.source: agent` through the PPO-family driver: the shipped warm start runs a GRPO step
on multi-turn calculator episodes (rows with observation holes, per-turn token rewards, the
step's episode counts as agent/* metrics), and evaluates greedy episodes."""

from pathlib import Path

import pytest

from baton.config import ConfigError, load_config
from baton.metrics import read_metrics
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes/agent_calculator.yaml"
SMALL = ["data.prompts_per_step=2", "rollout.n=2", "data.eval_size=4", "actor.mini_batch_size=0",
         "actor.micro_batch_size=4", "trainer.progress=false"]


def test_a_grpo_step_on_calculator_episodes(tmp_path):
    result = train(load_config(PPOConfig, RECIPE, [f"trainer.run_dir={tmp_path}", "trainer.steps=1", *SMALL]))
    step = [r for r in read_metrics(tmp_path) if r["step"] == 1][0]
    assert step["agent/trajectories"] == 4 and step["agent/turns_mean"] >= 1
    assert "actor/loss" in step and 0 <= step["reward/mean"] <= 1
    assert {"start/eval/accuracy_greedy", "eval/accuracy_greedy", "eval/tool_call_ok"} <= set(result)


def test_agent_keys_need_each_other():
    with pytest.raises(ConfigError, match="data.source=agent"):
        load_config(PPOConfig, RECIPE, ["agent=null"])
    with pytest.raises(ConfigError, match="data.source=agent"):
        load_config(PPOConfig, RECIPE, ["data.source=rollout"])
    with pytest.raises(ConfigError, match="not supported for episodes"):
        load_config(PPOConfig, RECIPE, ["trainer.mode=one_step_off"])
