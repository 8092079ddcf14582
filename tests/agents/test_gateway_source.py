"""`data.source: gateway`: an agent written with the official `openai` client (openai_agent.py)
trains through the PPO-family driver unchanged; its rows are the gateway's recorded session
tokens (observation holes included), and the trainer's logprobs of them are the engine's."""

from pathlib import Path

import pytest

from baton.config import ConfigError, load_config
from baton.metrics import read_metrics
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig

pytest.importorskip("openai")
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes/agent_calculator.yaml"
GATEWAY = ["data.source=gateway", "gateway.agent=openai_agent:solve", "agent=null", "data.task=arithmetic",
           "model.path=checkpoints/arith-sft", "data.prompts_per_step=2", "rollout.n=2", "data.eval_size=3",
           "actor.mini_batch_size=0", "actor.micro_batch_size=4", "trainer.progress=false"]


@pytest.fixture(autouse=True)
def _agent_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.chdir(REPO)


def test_openai_agent_trains_on_session_tokens(tmp_path):
    result = train(load_config(PPOConfig, RECIPE, [f"trainer.run_dir={tmp_path}", "trainer.steps=2", *GATEWAY]))
    steps = [r for r in read_metrics(tmp_path) if r.get("step") in (1, 2) and "actor/loss" in r]
    assert len(steps) == 2
    for s in steps:
        assert s["agent/trajectories"] == 4 and 0 <= s["reward/mean"] <= 1
        assert s["actor/approx_kl"] < 1e-3  # the trainer's logprobs of the recorded tokens = the engine's
    assert "eval/accuracy_greedy" in result and "start/eval/accuracy_greedy" in result


def test_sessions_on_a_generator_of_its_own(tmp_path):
    """The rollout on a pool of its own (`SessionGeneratorSource`, the source of trainer.mode
    one_step_off / async; here sync on the local backend: the generator in this process):
    the sessions run through the generator's engine, their groups step-unique."""
    cfg = load_config(PPOConfig, RECIPE, [f"trainer.run_dir={tmp_path}", "trainer.steps=2", *GATEWAY,
                                          "placement.pools.gen=1", "placement.roles.rollout=gen"])
    train(cfg)
    steps = [r for r in read_metrics(tmp_path) if r.get("step") in (1, 2)]
    assert [s["agent/trajectories"] for s in steps] == [4, 4] and all("actor/loss" in s for s in steps)
    assert load_config(PPOConfig, RECIPE, [*GATEWAY, "trainer.mode=one_step_off"]).placement.roles["rollout"] == "gen"


def test_session_rows_are_the_recorded_tokens(tmp_path):
    import torch

    from baton import fields as F
    from baton.agents.config import GatewayAgentConfig
    from baton.agents.gateway_run import run_sessions
    from baton.batch import collate
    from baton.envs import get_task
    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.embedded.engine import EmbeddedEngine

    tok = load_tokenizer("checkpoints/arith-sft")
    engine = EmbeddedEngine(load_model("checkpoints/arith-sft"), tok)
    rows = run_sessions(engine, tok, collate(get_task("arithmetic").eval_rows(3)), 2,
                        GatewayAgentConfig(agent="openai_agent:solve"), temperature=1.0)
    assert len(rows) + sum(rows.meta["agent_stats"]["dropped"].values()) == 6
    mask = rows[F.RESPONSE_MASK].bool()
    wrong = rows[F.REWARDS] == 0  # asked twice: a second policy turn after the agent's user message
    second_turn = (~mask[:, :-1] & mask[:, 1:]).any(1)
    assert (second_turn | ~wrong).all() and wrong.any()
    lp = rows[F.ROLLOUT_LOGPROBS]
    assert (lp[~mask] == 0).all() and (lp[mask] < 0).all()
    assert torch.equal(torch.unique(rows[F.GROUP_INDEX]), torch.arange(len(torch.unique(rows[F.GROUP_INDEX]))))


@pytest.mark.parametrize("overrides,match", [
    (["gateway=null"], "data.source=gateway"),
    (["data.source=rollout", "reward.functions={arithmetic/correct: 1.0}"], "data.source=gateway"),
    (["agent={env: calculator}"], "data.source=agent"),
    (["gateway.agent=openai_agent:not_async"], "not an async function"),
    (["gateway.agent=nope"], "module:attr"),
    (["reward.functions={arithmetic/correct: 2.0}"], "reward.functions"),
    (["rollout.top_p=0.5"], "rollout.top_p"),
])
def test_gateway_keys_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(PPOConfig, RECIPE, [*GATEWAY, *overrides])
