"""A draw in which no episode or session finished (the env or agent raised, hung, never
sampled) is skipped and counted, and drawn again; after `agent.max_failed_steps`
(`gateway.max_failed_steps`) such draws in a row the run stops with `AgentFailureError`
giving the counts by cause, in one line (before: `KeyError: "Batch has no field
'rollout_logprobs'"` in the driver). Real GRPO runs of the shipped warm starts."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from baton.agents.envs import CalculatorEnv, register_env
from baton.config import load_config
from baton.metrics import read_metrics
from baton.sources.episodes import AgentFailureError
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes/agent_calculator.yaml"
SMALL = ["data.prompts_per_step=2", "rollout.n=2", "data.eval_size=2", "actor.mini_batch_size=0",
         "actor.micro_batch_size=4", "trainer.progress=false", "trainer.steps=1"]
GATEWAY = ["data.source=gateway", "agent=null", "data.task=arithmetic", "model.path=checkpoints/arith-sft"]


@register_env("test_start_raises")
class StartRaises(CalculatorEnv):
    async def start(self):
        raise ConnectionError("the env's server is down")


@register_env("test_first_draw_raises")
class FirstDrawRaises(CalculatorEnv):
    """Starts 3-6 raise: the first training draw of 2 x 2 (starts 1-2: the first evaluation's)."""
    starts, lock = 0, threading.Lock()

    async def start(self):
        with FirstDrawRaises.lock:
            FirstDrawRaises.starts += 1
            n = FirstDrawRaises.starts
        if 3 <= n <= 6:
            raise ConnectionError("the env's server is down")
        return await super().start()


@pytest.fixture(autouse=True)
def _repo(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # faulty_agents
    monkeypatch.chdir(REPO)


def _train(tmp_path, *overrides):
    return train(load_config(PPOConfig, RECIPE, [f"trainer.run_dir={tmp_path}", *SMALL, *overrides]))


def test_episodes_that_all_fail_stop_the_run_with_the_counts_by_cause(tmp_path):
    with pytest.raises(AgentFailureError) as e:
        _train(tmp_path, "agent.env=test_start_raises", "agent.tools=null", "agent.max_failed_steps=2")
    assert str(e.value).startswith("step 1: no trajectory finished in 2 draws in a row (agent.max_failed_steps=2): "
                                   "of 8 trajectories, 8 raised") and "\n" not in str(e.value)


def test_a_draw_with_no_episode_is_skipped_counted_and_drawn_again(tmp_path):
    _train(tmp_path, "agent.env=test_first_draw_raises", "agent.tools=null")
    step = [r for r in read_metrics(tmp_path) if r["step"] == 1][0]
    assert step["agent/failed_draws"] == 1 and step["agent/dropped/env_error"] == 4 and "actor/loss" in step


def test_gateway_sessions_that_all_fail_stop_the_run_with_the_counts_by_cause(tmp_path):
    pytest.importorskip("openai")
    with pytest.raises(AgentFailureError, match=r"^step 1: no session finished in 2 draws in a row "
                                                r"\(gateway.max_failed_steps=2\): of 8 sessions, 8 raised"):
        _train(tmp_path, *GATEWAY, "gateway.agent=faulty_agents:raises", "gateway.max_failed_steps=2")
    with pytest.raises(AgentFailureError, match="of 8 sessions, 8 never sampled"):
        _train(tmp_path / "b", *GATEWAY, "gateway.agent=faulty_agents:never_samples", "gateway.max_failed_steps=2")
