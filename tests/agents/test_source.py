"""EpisodeSource over the real colocated actor + rollout roles (local backend): the rollout
role's `generate_episodes` hook runs the episodes through its embedded engine."""

from __future__ import annotations

import pytest
import torch

from baton import fields as F
from baton.agents.config import AgentConfig
from baton.agents.envs import multiplication_rows
from baton.sources.episodes import EpisodeSource
from baton.config import load_config
from baton.controller import ResourcePool, colocated_groups
from baton.data.prompts import PromptSampler
from baton.models.make import make_tiny_checkpoint
from baton.trainers.ppo_config import PPOConfig
from baton.trainers.session.state import RunState
from baton.workers.actor import ActorWorker
from baton.workers.rollout import RolloutConfig, RolloutWorker


@pytest.fixture(scope="module")
def roles(tmp_path_factory):
    model_dir = str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=1))
    cfg = load_config(PPOConfig, overrides=[f"model.path={model_dir}", "rollout.n=2"])
    pool = ResourcePool(1, backend="local", threads_per_worker=1)
    return colocated_groups(pool, {
        "actor": (ActorWorker, (cfg.model, cfg.actor, cfg.algo),
                  dict(temperature=1.0, max_new_tokens=8, total_steps=2, seed=0)),
        "rollout": (RolloutWorker, (RolloutConfig(n=2, max_new_tokens=8),),
                    dict(task="arithmetic", seed=0, probe_prompt="12+34="))})


def test_episode_source_rows(roles):
    state = RunState(sampler=PromptSampler(multiplication_rows(8, seed=0), seed=0), eval_rows=[])
    src = EpisodeSource(AgentConfig(max_turns=2, max_tokens=20, turn_max_new_tokens=6), roles["rollout"], state, 2)
    rows = src.rows(3)
    assert sum(src.last_stats["dropped"].values()) + len(rows) == 4
    assert set(rows[F.GROUP_INDEX].tolist()) <= {6, 7}  # step 3 x 2 prompts per step
    mask, lp = rows[F.RESPONSE_MASK], rows[F.ROLLOUT_LOGPROBS]
    assert mask.shape == lp.shape == rows[F.TOKEN_REWARDS].shape and mask.shape[1] <= 20
    assert (lp[mask == 0] == 0).all() and (lp[mask == 1] < 0).all()
    assert rows[F.REWARDS].shape == (len(rows),) and rows[F.POLICY_VERSION].dtype == torch.long
    assert "answer" in rows
    # a random model samples bytes that are not UTF-8 / special ids: re-rendering its text
    # does not give its tokens back, and the invariant reports it per segment kind
    assert set(src.last_stats["token_mismatch"]) <= {"policy", "boundary", "obs", "end"}
    src.weights_updated(1)


def test_greedy_episodes_for_evaluation(roles):
    from dataclasses import asdict

    from baton.agents.rollout import agent_metrics
    from baton.batch import collate

    cfg = AgentConfig(max_turns=2, max_tokens=20, turn_max_new_tokens=6)
    rows = roles["rollout"].generate_episodes(collate(multiplication_rows(3, seed=1)), 1, asdict(cfg), True)
    assert len(rows) + sum(rows.meta["agent_stats"]["dropped"].values()) == 3  # one per prompt
    m = agent_metrics(rows, rows.meta["agent_stats"], 3)
    assert set(m) == {"accuracy", "tool_call_ok", "first_turn_call_ok"}


def test_trainer_logprobs_match_the_engine_across_observations(tmp_path):
    """The trainer's logprobs of multi-turn rows equal the engine's behaviour logprobs on every
    policy token, with the shared-prompt forward and without: observation tokens (loss mask 0)
    are attended to as context (`sequences.response_attention`), not masked out."""
    from baton.agents.rollout import run_episodes
    from baton.batch import collate
    from baton.envs import get_task
    from baton.models.load import load_model, load_tokenizer
    from baton.protocol import SamplingParams
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.workers.sequences import response_logprobs

    model_dir = str(make_tiny_checkpoint(tmp_path / "tiny", preset="0.75m", seed=3))
    model, tok = load_model(model_dir).eval(), load_tokenizer(model_dir)
    torch.manual_seed(0)
    rows, _ = run_episodes(EmbeddedEngine(model, tok), tok, collate(get_task("guess").train_rows(3)), 2,
                           AgentConfig(env="guess", max_turns=3, max_tokens=24, turn_max_new_tokens=3),
                           SamplingParams(temperature=1.0, max_new_tokens=3))
    mask = rows[F.RESPONSE_MASK].bool()
    assert (~mask[:, :-1] & mask[:, 1:]).any()  # a policy turn after an observation
    for share in (True, False):
        with torch.no_grad():
            lp = response_logprobs(model, rows, share_prompts=share)[0]
        diff = (lp.double() - rows[F.ROLLOUT_LOGPROBS].double())[mask].abs().max().item()
        assert diff < 1e-4, (share, diff)
