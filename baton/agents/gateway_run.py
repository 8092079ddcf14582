"""`data.source: gateway`: an agent written against the OpenAI API trains through `baton train`.

    rows = run_sessions(engine, tokenizer, prompts, n, GatewayAgentConfig(agent="my_agent:solve"), temperature)

For each prompt row, `n` sessions of a `Gateway` (baton.services.gateway) served on
127.0.0.1 in front of `engine` (the rollout role's, colocated: it holds the policy's
weights); each session runs the user's `async def agent(base_url, api_key, row) -> float`
unchanged (the official `openai` client or httpx against `base_url`, a session-scoped
OpenAI endpoint), and the float it returns is the session's reward. The gateway records the
session's exact token ids, behaviour logprobs and masks; `GatewaySource` turns finished
sessions into rows, one group per prompt (groups short by dropped sessions). An agent that
raises, returns None or runs past `session_timeout_s` is dropped, counted by kind in
`rows.meta["agent_stats"]["dropped"]` (never scored 0). The run's temperature replaces the
agent's, so the trainer's logprobs are those of the policy that sampled.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from typing import Any

from baton.agents.config import GatewayAgentConfig
from baton.batch import Batch
from baton.rollout.server import ServerThread
from baton.services.gateway import Gateway
from baton.services.gateway_engines import InProcessEngine
from baton.services.gateway_source import GatewaySource
from baton.user_modules import load_object


async def _one(gw: Gateway, fn: Any, url: str, key: str, row: dict, group: int, timeout_s: float) -> str | None:
    """Run the agent in one session; the reason it was dropped, or None when rewarded."""
    s = gw.new_session(group=str(group))
    try:
        reward = await asyncio.wait_for(fn(f"{url}/sessions/{s.id}/v1", key, dict(row)), timeout_s)
    except asyncio.TimeoutError:
        reason = "deadline"
    except Exception:  # noqa: BLE001 - the agent's failure drops its session, counted
        reason = "agent_error"
    else:
        reason = "no_reward" if reward is None else ("no_turns" if not s.turns else None)
        if reason is None:
            gw.set_reward(s.id, float(reward))
            return None
    gw.abort(s.id, reason)
    return reason


def run_sessions(engine: Any, tokenizer: Any, prompts: Batch, n: int, cfg: GatewayAgentConfig,
                 temperature: float | None) -> Batch:
    """`n` agent sessions per prompt row; rows of the finished ones (module docstring)."""
    fn = load_object(cfg.agent, "gateway.agent")
    gw = Gateway(InProcessEngine(engine), tokenizer, default_max_tokens=cfg.max_tokens,
                 max_session_tokens=cfg.max_session_tokens, temperature=temperature)
    key = secrets.token_hex(16)
    plain = [{k: prompts[k][i] for k in prompts.non_tensors} for i in range(len(prompts))]
    with ServerThread(gw.app(api_key=key)) as server:
        async def all_sessions() -> list[str | None]:
            return await asyncio.gather(*(_one(gw, fn, server.url, key, row, g, cfg.session_timeout_s)
                                          for g, row in enumerate(plain) for _ in range(n)))
        reasons = asyncio.run(all_sessions())
    groups = len({int(s.group) for s in gw.sessions.values() if s.reward is not None})
    stats: dict[str, Any] = {"trajectories": len(reasons), "dropped": dict(Counter(r for r in reasons if r))}
    if not groups:
        return Batch(meta={"agent_stats": stats})
    source = GatewaySource(gw, group_size=n, groups_per_step=groups, wait_s=0.0)
    out = source.rows(0)
    stats["boundary_mismatches"] = source.boundary_mismatches
    out.meta["agent_stats"] = stats
    return out
