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
    # the overlapping modes run the episodes on a generator of its own (tests/trainers/test_agent_async.py)
    assert load_config(PPOConfig, RECIPE, ["trainer.mode=one_step_off"]).placement.roles["rollout"] == "gen"


def _learns(tmp_path, overrides):
    result = train(load_config(PPOConfig, RECIPE, [f"trainer.run_dir={tmp_path}", "trainer.progress=false",
                                                   *overrides]))
    return ({k: result[f"start/eval/{k}"] for k in ("accuracy_greedy", "tool_call_ok")},
            {k: result[f"eval/{k}"] for k in ("accuracy_greedy", "tool_call_ok")})


def test_a_few_steps_learn_to_call_the_tool(tmp_path):
    """The shipped warm start rarely calls the tool (greedy: like the model without it); four
    GRPO steps on half the recipe's prompts raise held-out accuracy and well-formed calls."""
    start, end = _learns(tmp_path, ["trainer.steps=4", "data.prompts_per_step=8", "actor.lr_warmup_steps=0",
                                    "data.eval_size=20", "actor.mini_batch_size=0"])
    assert start["accuracy_greedy"] <= 0.2 and start["tool_call_ok"] <= 0.2
    assert end["accuracy_greedy"] > start["accuracy_greedy"] and end["tool_call_ok"] > start["tool_call_ok"]


@pytest.mark.slow
def test_the_recipe_learns(tmp_path):
    """The README's run: recipes/agent_calculator.yaml as shipped (60 steps, ~3-5 min here)."""
    start, end = _learns(tmp_path, [])
    assert start["accuracy_greedy"] <= 0.1 and start["tool_call_ok"] <= 0.1
    assert end["accuracy_greedy"] >= 0.5 and end["tool_call_ok"] >= 0.8
