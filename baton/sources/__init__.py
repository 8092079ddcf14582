"""Where a step's rows come from: one registry of row sources, each declared once with what
it can do (`SourceSpec`, baton.sources.base), which the config checks
(`baton.trainers.ppo_config`, `baton.trainers.session.config`, `baton.trainers.dpo_config`), the
drivers (`row_source`, `evaluation`) and `baton launch` ask.

    name               module        data.source  drivers          can
    rollout            colocated.py  rollout      ppo, online_dpo  draw more (DAPO), greedy baseline (ReMax)
    generator          ahead.py      rollout      ppo              run ahead (trainer.mode), needs a generator
    api                api.py        api          ppo              rows arrive scored; trainer.max_staleness bounds age
    agent              episodes.py   agent        ppo              multi-turn episodes, scored by the agent
    agent_generator    episodes.py   agent        ppo              the same, from a generator running ahead
    gateway            gateway.py    gateway      ppo              OpenAI-speaking agent sessions
    gateway_generator  gateway.py    gateway      ppo              the same, from a generator running ahead
    pairs              pairs.py      -            dpo              offline DPO's pairs from a jsonl

`source_name(cfg)` picks one: the entry for `data.source` whose `generator` matches whether
the rollout sits apart from the actor. A new source is one module with a
`build(cfg, roles, state)` plus one `SOURCES.add(name, SourceSpec(...))` (docs/EXTENDING.md).
Only this table is imported here; a source's module is imported when it is built.
"""

from __future__ import annotations

from typing import Any, Callable

from baton.registry import Registry, resolve
from baton.sources.base import Prompts, RowSource, SourceSpec, apart

SOURCES: Registry = Registry("row source")
API_KEYS = ("data.api_url", "data.servers", "data.sync_every", "data.weights_dir", "data.api_wait_s", "data.envs")
SCORED = dict(scored=True)
AGENT = dict(section="agent", reads=("agent",), evaluate="baton.sources.episodes:evaluate", **SCORED)
GATEWAY = dict(section="gateway", reads=("gateway",), evaluate="baton.sources.gateway:evaluate", own_sampling="agent",
               **SCORED)
SOURCES.add("rollout", SourceSpec("rollout", "baton.sources.colocated:build", drivers=("ppo", "online_dpo"),
                                  draws_more=True, greedy_baseline=True, checks_sync=True))
SOURCES.add("generator", SourceSpec("rollout", "baton.sources.ahead:build", generator=True))
SOURCES.add("api", SourceSpec("api", "baton.sources.api:build", bounds_age=True, own_sampling="environments",
                              sync_only=True, launched=True, checks_sync=True, reads=API_KEYS, **SCORED))
SOURCES.add("agent", SourceSpec("agent", "baton.sources.episodes:build_episodes", checks_sync=True, **AGENT))
SOURCES.add("agent_generator", SourceSpec("agent", "baton.sources.episodes:build_episode_generator", generator=True,
                                          **AGENT))
SOURCES.add("gateway", SourceSpec("gateway", "baton.sources.gateway:build_sessions", **GATEWAY))
SOURCES.add("gateway_generator", SourceSpec("gateway", "baton.sources.gateway:build_session_generator",
                                            generator=True, **GATEWAY))
# offline DPO's driver evaluates itself (held-out pairs against the reference, and data.task)
SOURCES.add("pairs", SourceSpec("", "baton.sources.pairs:build", evaluate="", drivers=("dpo",)))


def data_sources(driver: str = "ppo") -> list[str]:
    """The `data.source` values some source `driver` reads from answers, in registration order."""
    return list(dict.fromkeys(spec.data_source for spec in SOURCES.values()
                              if spec.data_source and driver in spec.drivers))


def source_reads(data_source: str) -> set[str]:
    """The sections and keys only some sources read that a `data.source=data_source` form reads."""
    return {key for spec in SOURCES.values() if spec.data_source == data_source for key in spec.read_keys}


def unread_keys(data_source: str, is_set: Callable[[str], bool]) -> list[tuple[str, list[str]]]:
    """The sections and keys some source reads (`SourceSpec.read_keys`) but no `data.source=`
    `data_source` form does, that `is_set` says a recipe set, each with the data.source values
    that read it: what the config checks refuse, so no key is accepted and ignored."""
    mine = source_reads(data_source)
    readers: dict[str, list[str]] = {}
    for spec in SOURCES.values():
        for key in spec.read_keys:
            if spec.data_source and spec.data_source not in readers.setdefault(key, []):
                readers[key].append(spec.data_source)
    return [(key, who) for key, who in readers.items() if key not in mine and is_set(key)]


def source_name(data_source: str, generator: bool) -> str:
    """The registered source for `data.source` with the rollout apart (`generator`) or not;
    a source without a generator form (api) is chosen either way."""
    mine = [name for name, spec in SOURCES.items() if spec.data_source == data_source]
    if not mine:
        raise ValueError(f"data.source={data_source!r}: none of the row sources reads it; known: {data_sources()}")
    exact = [name for name in mine if SOURCES[name].generator == generator]
    if len(exact) > 1 or (not exact and len(mine) > 1):  # which one runs would depend on import order
        raise ValueError(f"data.source={data_source!r} is answered by the row sources {exact or mine} alike "
                         f"(generator={generator}): give each registered source a data.source of its own")
    return (exact or mine)[0]


def needs_generator(cfg: Any) -> bool:
    """Whether `cfg` puts its rollout in a generator of its own: placed apart from the actor,
    or a `trainer.mode` that overlaps generation with the update."""
    return apart(cfg) or getattr(cfg.trainer, "mode", "sync") != "sync"


def source_spec(cfg: Any) -> SourceSpec:
    """The spec of the source `cfg` chooses (`data.source` and where the rollout sits)."""
    return SOURCES[source_name(cfg.data.source, needs_generator(cfg))]


def row_source(cfg: Any, roles: dict[str, Any], state: Any, name: str | None = None) -> RowSource:
    """The row source `cfg` asks for (or the one registered as `name`), built by its
    registered `build(cfg, roles, state)`."""
    spec = SOURCES[name] if name else source_spec(cfg)
    return resolve(spec.build)(cfg, roles, state)


def evaluation(cfg: Any, roles: dict[str, Any], eval_rows: list[dict[str, Any]]) -> dict[str, float]:
    """Held-out metrics the way the source `cfg` chooses generates: its registered `evaluate`."""
    return resolve(source_spec(cfg).evaluate)(cfg, roles, eval_rows)


__all__ = ["SOURCES", "Prompts", "RowSource", "SourceSpec", "apart", "data_sources", "evaluation", "needs_generator",
           "row_source", "source_name", "source_reads", "source_spec", "unread_keys"]
