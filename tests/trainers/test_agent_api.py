"""Multi-turn episodes through the services path, end to end: an `AgentEnvironment` (what
`baton env --env baton.agents.api_env:agent_environment` runs) plays the guess game against a
real `baton serve` over HTTP and pushes its groups to a real `baton api`; the trainer
(`data.source: api`) trains on them for a few steps: rows with observation holes and per-turn
token rewards reach the advantage estimator, and the server follows the trainer's weights."""

import threading
from pathlib import Path

import torch

from baton.agents.api_env import AgentEnvironment
from baton.config import load_config
from baton.metrics import read_metrics
from baton.models.load import load_model, load_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.remote import RemoteEngine
from baton.rollout.server import ServerThread, build_app
from baton.services.api import build_api_app
from baton.services.client import APIClient
from baton.services.env_runner import EnvRunner
from baton.trainers import ppo
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "checkpoints/arith-sft")
GUESS = {"env": "guess", "max_turns": 5, "max_tokens": 60, "turn_max_new_tokens": 6, "truncation": "truncate",
         "env_args": {"suffix": "="}}  # as recipes/agent_guess.yaml


def test_a_trainer_steps_on_multi_turn_groups_from_the_api(tmp_path, monkeypatch):
    seen = []
    real = ppo.compute_advantages

    def spy(estimator, **kw):  # the real estimator; the rows it was given kept for the asserts
        seen.append((kw["response_mask"].clone(), kw["token_rewards"].clone()))
        return real(estimator, **kw)

    monkeypatch.setattr(ppo, "compute_advantages", spy)
    tok = load_tokenizer(MODEL)
    engine = EmbeddedEngine(load_model(MODEL).eval(), tok)
    env = AgentEnvironment(tok, task="guess", agent=GUESS, group_size=2, temperature=1.0, eval_size=4)
    env.setup()
    stop = threading.Event()
    with ServerThread(build_api_app(str(tmp_path / "api.sqlite"))) as api, \
            ServerThread(build_app(engine, tok, "arith-sft", model_path=MODEL)) as served:
        runner = EnvRunner(env, APIClient(api.url, stop=stop), [RemoteEngine(served.url)], concurrency=2, stop=stop)
        thread = threading.Thread(target=runner.run, kwargs={"grace_s": 5}, daemon=True)
        thread.start()
        try:
            ppo.train(load_config(PPOConfig, REPO / "recipes/grpo_arithmetic_api.yaml", [
                f"model.path={MODEL}", f"trainer.run_dir={tmp_path / 'run'}", f"data.api_url={api.url}",
                f"data.servers=[{served.url}]", "data.envs=[]", "data.prompts_per_step=2", "rollout.n=2",
                "data.eval_size=4", "actor.mini_batch_size=4", "actor.micro_batch_size=4", "actor.lr=1e-3",
                "algo.advantage=turn_grpo", "trainer.steps=2", "trainer.max_staleness=1",
                "trainer.check_weight_sync=true", "trainer.progress=false"]))
        finally:
            stop.set()
            thread.join(30)
    steps = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2] and "actor/grad_norm" in steps[0]
    assert engine.version == 2  # the server samples with the trainer's weights
    for mask, token_rewards in seen:
        m = mask.bool()
        assert (~m[:, :-1] & m[:, 1:]).any()  # a policy turn after an observation (a hole in the mask)
        ends = m & ~torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], 1)  # each turn's last policy token
        assert (token_rewards[~ends] == 0).all()  # rewards only where a turn ends
    assert any((tr != 0).any() for _, tr in seen)
    assert runner.counts["pushed"] >= 2 and runner.counts["refused"] == 0
