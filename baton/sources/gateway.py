"""`SessionSource`: the row source of `data.source: gateway` (registered as "gateway" in
`baton.sources.SOURCES`, "gateway_generator" on a generator of its own): sessions of an
OpenAI-speaking agent through a gateway on the rollout role's engine
(`RolloutWorker.generate_sessions`, baton.agents.gateway_run, which collects finished
sessions with `baton.services.gateway_rows.GatewayRows`).

Sessions draw as agent episodes do (baton.sources.episodes: a draw where none finished is
drawn again and counted, `gateway.max_failed_steps` in a row is `AgentFailureError`); the
gateway numbers groups per call, made step-unique here.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable

from baton import fields as F
from baton.agents.config import GatewayAgentConfig
from baton.batch import Batch
from baton.controller import Future
from baton.sources.ahead import generator_args
from baton.sources.base import REDRAW, Prompts
from baton.sources.episodes import EpisodeGeneratorSource, EpisodeSource


def step_unique(rows: Batch, step: int, prompts_per_step: int) -> Batch:
    """`rows` with the groups the gateway numbered per call (0, 1, ...) made step-unique, as
    `baton.sources.base.number_groups` numbers a step's prompts: step * prompts_per_step + group."""
    if len(rows):
        rows[F.GROUP_INDEX] = rows[F.GROUP_INDEX] + step * prompts_per_step
    return rows


class SessionSource(EpisodeSource):
    """`data.source: gateway`: rows are sessions of an OpenAI-speaking agent through a gateway
    on the rollout role's engine (`RolloutWorker.generate_sessions`, baton.agents.gateway_run);
    group_index as EpisodeSource, metrics agent/* (sessions, drops by kind)."""

    SECTION = "gateway"

    def _draw(self, step: int) -> Callable[[int], Batch]:
        def draw(k: int) -> Batch:
            rows = self.rollout.generate_sessions(self.state.next_prompts(self.prompts_per_step), step + REDRAW * k,
                                                  asdict(self.cfg))
            return step_unique(rows, step, self.prompts_per_step)
        return draw


class SessionGeneratorSource(EpisodeGeneratorSource):
    """`data.source: gateway` on a generator of its own: `SessionSource`'s sessions under
    `GeneratorSource`'s staleness schedule (groups made step-unique as the rows arrive)."""

    SECTION = "gateway"

    def _generate(self, prompts: Batch, step: int) -> Future:
        return self.rollout.submit("generate_sessions", prompts, step, asdict(self.cfg))

    def rows(self, step: int) -> Batch:
        return step_unique(super().rows(step), step, self.prompts_per_step)


def evaluate_sessions(rollout: Any, cfg: GatewayAgentConfig, eval_rows: list[dict[str, Any]]) -> dict[str, float]:
    """Held-out sessions, one per prompt at temperature 0: the agent's mean reward (a dropped
    session counting 0) as eval/accuracy_greedy."""
    from baton.batch import collate

    rows = rollout.generate_sessions(collate(eval_rows), 0, asdict(cfg), True)
    total = rows[F.REWARDS].sum().item() if len(rows) else 0.0
    return {"eval/accuracy_greedy": total / max(len(eval_rows), 1)}


def evaluate(cfg: Any, roles: dict[str, Any], eval_rows: list[dict[str, Any]]) -> dict[str, float]:
    """The registered evaluation of the gateway sources: `evaluate_sessions` on the rollout role."""
    return evaluate_sessions(roles["rollout"], cfg.gateway, eval_rows)


# --- the registered builders (baton.sources.SOURCES) --------------------------------------
def build_sessions(cfg: Any, roles: dict[str, Any], state: Prompts) -> SessionSource:
    return SessionSource(cfg.gateway, roles["rollout"], state, cfg.data.prompts_per_step)


def build_session_generator(cfg: Any, roles: dict[str, Any], state: Prompts) -> SessionGeneratorSource:
    return SessionGeneratorSource(cfg.gateway, **generator_args(cfg, roles, state))
