"""Which row source a run takes its rows from (see `baton.trainers.sources`): the one place
that knows every implementation, so the sources themselves need not know each other."""

from __future__ import annotations

from typing import Any

from baton.trainers.api_source import ApiSource
from baton.trainers.async_source import generator_args, rollout_source
from baton.trainers.episode_source import (EpisodeGeneratorSource, EpisodeSource, SessionGeneratorSource,
                                           SessionSource)
from baton.trainers.placement import apart
from baton.trainers.run_state import RunState
from baton.trainers.sources import RowSource


def row_source(cfg: Any, roles: dict[str, Any], state: RunState) -> RowSource:
    """The source `cfg` asks for: `data.source` (rollout | api | agent | gateway), and for this run's own
    rollout whether it sits beside the actor (`RolloutSource`) or on a pool of its own
    (`GeneratorSource`, as far ahead as `trainer.mode` allows)."""
    probe = state.eval_rows[0]["prompt"]
    if cfg.data.source == "api":
        return ApiSource(cfg, roles["actor"], state, probe_prompt=probe)
    if cfg.data.source == "agent" and apart(cfg):  # a generator of its own (trainer.mode)
        return EpisodeGeneratorSource(cfg.agent, **generator_args(cfg, roles, state))
    if cfg.data.source == "agent":
        return EpisodeSource(cfg.agent, roles["rollout"], state, cfg.data.prompts_per_step)
    if cfg.data.source == "gateway" and apart(cfg):
        return SessionGeneratorSource(cfg.gateway, **generator_args(cfg, roles, state))
    if cfg.data.source == "gateway":
        return SessionSource(cfg.gateway, roles["rollout"], state, cfg.data.prompts_per_step)
    return rollout_source(cfg, roles, state)
