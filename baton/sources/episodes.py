"""`EpisodeSource`: the row source of `data.source: agent` (registered as "agent" in
`baton.sources.SOURCES`; "agent_generator" below; the gateway's sessions, which draw the same
way, are baton.sources.gateway).

    source = EpisodeSource(AgentConfig(**recipe["agent"]), rollout, state, prompts_per_step)
    rows = source.rows(step)      # multi-turn rows, fields below
    source.weights_updated(version, check)

Each step draws prompts from the run's sampler, numbers them with a step-unique
`group_index`, and has the rollout role run `rollout.n` episodes per prompt
(`RolloutWorker.generate_episodes`: the turns of all trajectories batched through its
engine). Rows: prompt_ids/mask, response_ids, response_mask (0 on observation and template
tokens), rollout_logprobs (0 there), token_rewards (per-turn rewards at each turn's last
policy token, the trajectory reward at the last one), rewards (their sum), group_index,
turn_index, num_turns, policy_version, completion, finish_reason, tool_status; a group
may have fewer than n rows (dropped trajectories). `last_stats` holds the step's counts
(drops by kind, parse statuses, template-invariant mismatches per segment kind).

A draw in which no trajectory (or session) finished has nothing to train on: every source
here skips it and draws again (new prompts, seeds of their own), counting it
(`agent/failed_draws` on the step's line, the draw's drops merged into the step's); after
`agent.max_failed_steps` (`gateway.max_failed_steps`) such draws in a row, `AgentFailureError`
says, in one line, how many failed by cause (raised, timed out, never sampled, ...).

`EpisodeGeneratorSource`: the same episodes from a generator on a pool of its own
(`trainer.mode` one_step_off | async, or a rollout placed apart): `GeneratorSource`'s
admission and staleness schedule, its generator running `generate_episodes` instead of
`generate`; rows keep their masks, behaviour logprobs and the version that sampled them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any, Callable

from baton.agents.config import AgentConfig
from baton.agents.dispatch import STATS, merge_stats
from baton.batch import Batch
from baton.controller import Future
from baton.sources.ahead import GeneratorSource, generator_args
from baton.sources.base import REDRAW, Prompts, number_groups
from baton.sources.colocated import RolloutSource


CAUSES = {"tool_error": "raised", "env_error": "raised", "agent_error": "raised", "tool_timeout": "timed out",
          "env_timeout": "timed out", "trajectory_timeout": "timed out", "deadline": "timed out",
          "no_turns": "never sampled", "no_reward": "returned no reward", "budget": "out of tokens or turns",
          "context": "out of context"}


class AgentFailureError(RuntimeError):
    """Draws in a row in which no trajectory or session finished: nothing to train on."""


def draw_until_rows(draw: Callable[[int], Batch], step: int, limit: int, key: str) -> Batch:
    """The rows of the first of `draw(0)`, `draw(1)`, ... that has any, its STATS those of
    every draw merged (+ failed_draws when some had none); AgentFailureError after `limit`
    draws without a row (`key`: the config section, for the message)."""
    parts = []
    for attempt in range(limit):
        rows = draw(attempt)
        parts.append((rows.meta.get(STATS, {}), len(rows)))
        if len(rows):
            rows.meta[STATS] = merge_stats(parts) if attempt else parts[0][0]
            if attempt:
                rows.meta[STATS]["failed_draws"] = attempt
            return rows
    stats = merge_stats(parts)
    causes: Counter = Counter()
    for kind, k in stats.get("dropped", {}).items():
        causes[CAUSES.get(kind, kind)] += k
    what = ("session", "sessions") if key == "gateway" else ("trajectory", "trajectories")
    raise AgentFailureError(
        f"step {step}: no {what[0]} finished in {limit} draws in a row ({key}.max_failed_steps={limit}): of "
        f"{stats.get('trajectories', 0)} {what[1]}, " + ", ".join(f"{k} {c}" for c, k in causes.most_common())
        + (f", {stats['abandoned']} of them left running (their code blocked its event loop)"
           if stats.get("abandoned") else "") + " (the first fault of each kind is in the log above)")


def stats_metrics(stats: dict[str, Any]) -> dict[str, float]:
    """A step's episode counts as metrics (agent/*): drops by kind, tool-call parse statuses,
    mean turns, template-invariant mismatches by segment kind."""
    out: dict[str, float] = {}
    for key, value in stats.items():
        if isinstance(value, dict):
            out.update({f"agent/{key}/{k}": float(v) for k, v in value.items()})
        elif isinstance(value, (int, float)):
            out[f"agent/{key}"] = float(value)
    return out


class EpisodeSource(RolloutSource):
    """Weights, state and close as `RolloutSource` (the same rollout role); rows are episodes."""
    SECTION = "agent"  # the config section it runs (its max_failed_steps, named in the error)

    def __init__(self, cfg: AgentConfig, rollout: Any, state: Prompts, prompts_per_step: int) -> None:
        cfg.check()
        super().__init__(rollout, state, prompts_per_step)
        self.cfg = cfg
        self.last_stats: dict[str, Any] = {}

    def rows(self, step: int) -> Batch:
        rows = draw_until_rows(self._draw(step), step, self.cfg.max_failed_steps, self.SECTION)
        self.last_stats = rows.meta.get(STATS, {})
        return rows

    def _draw(self, step: int) -> Callable[[int], Batch]:
        def draw(k: int) -> Batch:
            prompts = number_groups(self.state.next_prompts(self.prompts_per_step), step, self.prompts_per_step)
            return self.rollout.generate_episodes(prompts, step + REDRAW * k, asdict(self.cfg))
        return draw

    def metrics(self) -> dict[str, float]:
        return stats_metrics(self.last_stats)


class EpisodeGeneratorSource(GeneratorSource):
    """`EpisodeGeneratorSource(cfg, **generator_args(...))`: `GeneratorSource` whose generator
    runs episodes; metrics as `EpisodeSource` (of the step last handed to the trainer)."""
    SECTION = "agent"

    def __init__(self, cfg: AgentConfig, **kwargs: Any) -> None:
        cfg.check()
        super().__init__(**kwargs)
        self.cfg = cfg
        self.last_stats: dict[str, Any] = {}

    def _generate(self, prompts: Batch, step: int) -> Future:
        prompts = number_groups(prompts, step, self.prompts_per_step)
        return self.rollout.submit("generate_episodes", prompts, step, asdict(self.cfg))

    def rows(self, step: int) -> Batch:
        def draw(k: int) -> Batch:  # a redraw runs behind the steps already admitted
            if not k:
                return GeneratorSource.rows(self, step)
            return self._generate(self.state.next_prompts(self.prompts_per_step), step + REDRAW * k).get()

        rows = draw_until_rows(draw, step, self.cfg.max_failed_steps, self.SECTION)
        self.last_stats = rows.meta.get(STATS, {})
        return rows

    def metrics(self) -> dict[str, float]:
        return stats_metrics(self.last_stats)


def evaluate_episodes(rollout: Any, cfg: AgentConfig, eval_rows: list[dict[str, Any]]) -> dict[str, float]:
    """Held-out episodes, greedy, one per prompt: accuracy (mean trajectory reward, a dropped
    trajectory counting 0; per-turn rewards included), and for an env with tools the rate of
    well-formed tool calls (tool_call_ok: the share of problems whose first turn is a
    well-formed call; _of_tried: among the turns that tried one)."""
    from baton.agents.envs import AGENT_ENVS
    from baton.agents.rollout import agent_metrics
    from baton.batch import collate

    rows = rollout.generate_episodes(collate(eval_rows), 0, asdict(cfg), True)
    stats = rows.meta.get("agent_stats", {})
    m = agent_metrics(rows, stats, len(eval_rows))
    # dropped episodes (an env past agent.env_timeout_s, an env error, ...) count 0 in the
    # accuracy; how many and why is logged beside it, as training's agent/dropped/* are
    dropped = {f"eval/dropped/{kind}": float(n) for kind, n in sorted((stats.get("dropped") or {}).items())}
    if not AGENT_ENVS[cfg.env].TOOLS:  # e.g. guess: no tool calls to count
        return {"eval/accuracy_greedy": m["accuracy"], **dropped}
    return {"eval/accuracy_greedy": m["accuracy"], "eval/tool_call_ok": m["first_turn_call_ok"],
            "eval/tool_call_ok_of_tried": m["tool_call_ok"], **dropped}


# --- the registered builders (baton.sources.SOURCES) --------------------------------------
def build_episodes(cfg: Any, roles: dict[str, Any], state: Prompts) -> EpisodeSource:
    return EpisodeSource(cfg.agent, roles["rollout"], state, cfg.data.prompts_per_step)


def build_episode_generator(cfg: Any, roles: dict[str, Any], state: Prompts) -> EpisodeGeneratorSource:
    return EpisodeGeneratorSource(cfg.agent, **generator_args(cfg, roles, state))


def evaluate(cfg: Any, roles: dict[str, Any], eval_rows: list[dict[str, Any]]) -> dict[str, float]:
    """The registered evaluation of the agent sources: `evaluate_episodes` on the rollout role."""
    return evaluate_episodes(roles["rollout"], cfg.agent, eval_rows)
