"""Multi-turn agent episodes as an environment service: groups travel through `baton api`.

    baton env --env baton.agents.api_env:agent_environment --server URL --api URL ...
    env = AgentEnvironment(tokenizer, task="multiply", agent={"env": "calculator", ...})
    group = env.collect(item, engine)            # group_size episodes through any Engine
    group.to_scored_data(env_id)                 # Atropos ScoredData, + optional per-turn fields

Each episode is one sequence: tokens = prompt + response (observation and template tokens
included), masks = -100 on the prompt and on every token the policy did not sample (an
Atropos trainer trains only where mask != -100, so it trains on the policy's tokens), the
engine's logprobs. Per-turn data rides in the per-sequence `overrides` (an Atropos field a
stock client ignores): `token_rewards` [[position in tokens, reward], ...] (per-turn rewards
at each turn's last policy token, the final reward at the last) and `turn_ends` (each
turn's last policy token); `baton.services.groups.groups_to_batch` turns the first into the
rows' token_rewards. Groups are full: trajectories dropped for a fault are sampled again (up
to `retries` times; then the collect fails, and the runner retries with backoff).
"""

from __future__ import annotations

from typing import Any

import torch

from baton import fields as F
from baton.agents.config import AgentConfig
from baton.agents.rollout import run_episodes
from baton.batch import Batch, collate
from baton.envs.base import Row, get_task
from baton.envs.environment import ScoredGroup, TaskEnvironment
from baton.protocol import Engine, SamplingParams

CALCULATOR = {"env": "calculator", "max_turns": 3, "max_tokens": 200, "turn_max_new_tokens": 80}


class TurnScoredGroup(ScoredGroup):
    """A ScoredGroup whose sequences carry per-turn fields in `overrides`."""

    def __init__(self, overrides: list[dict[str, Any]], **kw: Any) -> None:
        super().__init__(**kw)
        self.overrides = overrides

    def to_scored_data(self, env_id: int | None = None) -> dict[str, Any]:
        return {**super().to_scored_data(env_id), "overrides": self.overrides}


def episodes_to_group(rows: Batch) -> TurnScoredGroup:
    """Episode rows (baton.agents.rollout) as one scored group (module docstring)."""
    tokens, masks, logps, overrides = [], [], [], []
    for b in range(len(rows)):
        p = rows[F.PROMPT_IDS][b][rows[F.PROMPT_MASK][b].bool()].tolist()
        m = rows[F.RESPONSE_MASK][b]
        n = int(m.nonzero().max()) + 1 if m.any() else 0
        r, lp = rows[F.RESPONSE_IDS][b, :n].tolist(), rows[F.ROLLOUT_LOGPROBS][b, :n].tolist()
        tokens.append(p + r)
        masks.append([-100] * len(p) + [t if k else -100 for t, k in zip(r, m[:n].tolist())])
        logps.append([1.0] * len(p) + lp)
        tr = rows[F.TOKEN_REWARDS][b, :n]
        ends = (m[:n].bool() & ~torch.cat([m[1:n], m.new_zeros(1)]).bool()).nonzero().flatten()
        overrides.append({"token_rewards": [[len(p) + int(j), float(tr[j])] for j in tr.nonzero().flatten()],
                          "turn_ends": [len(p) + int(j) for j in ends]})
    return TurnScoredGroup(overrides, tokens=tokens, masks=masks, scores=rows[F.REWARDS].tolist(),
                           inference_logprobs=logps, finish_reasons=list(rows[F.FINISH_REASON]),
                           policy_version=int(rows[F.POLICY_VERSION].min()),
                           completions=list(rows[F.COMPLETION_TEXT]))


class AgentEnvironment(TaskEnvironment):
    """A TaskEnvironment whose samples are multi-turn episodes of an AGENT_ENVS env."""

    def __init__(self, tokenizer: Any, *, task: str = "multiply", agent: dict[str, Any] | None = None,
                 retries: int = 3, **options: Any) -> None:
        self.agent_cfg = AgentConfig(**(agent or CALCULATOR))
        self.agent_cfg.check()
        options.setdefault("max_new_tokens", self.agent_cfg.max_tokens)
        super().__init__(get_task(task), tokenizer, **options)
        self.retries = retries

    def collect(self, item: Row, engine: Engine) -> ScoredGroup:
        params = SamplingParams(temperature=self.temperature, top_p=self.top_p,
                                max_new_tokens=self.agent_cfg.turn_max_new_tokens)
        parts, need = [], self.group_size
        for _ in range(self.retries + 1):
            rows, _ = run_episodes(engine, self.tokenizer, collate([item]), need, self.agent_cfg, params)
            if len(rows):
                parts.append(rows)
            need -= len(rows)
            if need == 0:
                return episodes_to_group(Batch.concat(parts) if len(parts) > 1 else parts[0])
        raise RuntimeError(f"{need} of {self.group_size} episodes dropped after {self.retries} retries")

    def evaluate(self, engine: Engine) -> dict[str, float]:
        from baton.agents.evaluate import evaluate_agent

        return evaluate_agent(engine, self.tokenizer, self.eval_rows(), self.agent_cfg)


def agent_environment(tokenizer: Any, **options: Any) -> AgentEnvironment:
    """`baton env --env baton.agents.api_env:agent_environment`: the calculator agent's episodes."""
    return AgentEnvironment(tokenizer, **options)
