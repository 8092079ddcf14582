"""Where a step's rows come from: one registry of row sources, each declared once with what
it can do (`SourceSpec`, baton.sources.base), which the config check
(`baton.trainers.ppo_config`), the drivers (`row_source`) and `baton launch` ask.

    name               module        data.source  can
    rollout            colocated.py  rollout      draw more (DAPO), greedy baseline (ReMax)
    generator          ahead.py      rollout      run ahead (trainer.mode), needs a generator
    api                api.py        api          rows arrive scored; trainer.max_staleness bounds age
    agent              episodes.py   agent        multi-turn episodes, scored by the agent
    agent_generator    episodes.py   agent        the same, from a generator running ahead
    gateway            episodes.py   gateway      OpenAI-speaking agent sessions
    gateway_generator  episodes.py   gateway      the same, from a generator running ahead

`source_name(cfg)` picks one: the entry for `data.source` whose `generator` matches whether
the rollout sits apart from the actor. A new source is one module with a
`build(cfg, roles, state)` plus one `SOURCES.add(name, SourceSpec(...))` (docs/EXTENDING.md).
Only this table is imported here; a source's module is imported when it is built.
"""

from __future__ import annotations

from typing import Any

from baton.registry import Registry, resolve
from baton.sources.base import Prompts, RowSource, SourceSpec, apart

SOURCES: Registry = Registry("row source")
SCORED = dict(scored=True, reads=("data", "rollout", "trainer"))
SOURCES.add("rollout", SourceSpec("rollout", "baton.sources.colocated:build", draws_more=True, greedy_baseline=True))
SOURCES.add("generator", SourceSpec("rollout", "baton.sources.ahead:build", generator=True,
                                    reads=("data", "rollout", "trainer", "reward")))
SOURCES.add("api", SourceSpec("api", "baton.sources.api:build", bounds_age=True, own_sampling="environments",
                              sync_only=True, launched=True, **SCORED))
SOURCES.add("agent", SourceSpec("agent", "baton.sources.episodes:build_episodes", section="agent", **SCORED))
SOURCES.add("agent_generator", SourceSpec("agent", "baton.sources.episodes:build_episode_generator", section="agent",
                                          generator=True, **SCORED))
SOURCES.add("gateway", SourceSpec("gateway", "baton.sources.episodes:build_sessions", section="gateway",
                                  own_sampling="agent", **SCORED))
SOURCES.add("gateway_generator", SourceSpec("gateway", "baton.sources.episodes:build_session_generator",
                                            section="gateway", own_sampling="agent", generator=True,
                                            **SCORED))


def data_sources() -> list[str]:
    """The `data.source` values some registered source answers, in registration order."""
    return list(dict.fromkeys(spec.data_source for spec in SOURCES.values()))


def source_name(data_source: str, generator: bool) -> str:
    """The registered source for `data.source` with the rollout apart (`generator`) or not;
    a source without a generator form (api) is chosen either way."""
    mine = [name for name, spec in SOURCES.items() if spec.data_source == data_source]
    if not mine:
        raise ValueError(f"data.source={data_source!r}: none of the row sources reads it; known: {data_sources()}")
    exact = [name for name in mine if SOURCES[name].generator == generator]
    return (exact or mine)[0]


def needs_generator(cfg: Any) -> bool:
    """Whether `cfg` puts its rollout in a generator of its own: placed apart from the actor,
    or a `trainer.mode` that overlaps generation with the update."""
    return apart(cfg) or getattr(cfg.trainer, "mode", "sync") != "sync"


def source_spec(cfg: Any) -> SourceSpec:
    """The spec of the source `cfg` chooses (`data.source` and where the rollout sits)."""
    return SOURCES[source_name(cfg.data.source, needs_generator(cfg))]


def row_source(cfg: Any, roles: dict[str, Any], state: Any) -> RowSource:
    """The row source `cfg` asks for, built by its registered `build(cfg, roles, state)`."""
    return resolve(source_spec(cfg).build)(cfg, roles, state)


__all__ = ["SOURCES", "Prompts", "RowSource", "SourceSpec", "apart", "data_sources", "needs_generator", "row_source", "source_name",
           "source_spec"]
