"""`data.source: gateway`: an agent written against the OpenAI API trains through `baton train`.

    rows = run_sessions(engine, tokenizer, prompts, n, GatewayAgentConfig(agent="my_agent:solve"), temperature)

For each prompt row, `n` sessions of a `Gateway` (baton.services.gateway) served on
127.0.0.1 in front of `engine` (the rollout role's, colocated: it holds the policy's
weights); each session runs the user's `async def agent(base_url, api_key, row) -> float`
unchanged (the official `openai` client or httpx against `base_url`, a session-scoped
OpenAI endpoint), and the float it returns is the session's reward. Each agent runs on an
event loop and daemon thread of its own under a watchdog (baton.agents.watchdog): one that
blocks its loop (`time.sleep` in `async def`) is dropped at `session_timeout_s` all the same,
and the others go on (`agent_stats["abandoned"]` counts such agents). The gateway records the
session's exact token ids, behaviour logprobs and masks; `GatewayRows` turns finished
sessions into rows, one group per prompt (groups short by dropped sessions). An agent that
raises, returns None or runs past `session_timeout_s` is dropped, counted by kind in
`rows.meta["agent_stats"]["dropped"]` (never scored 0). The run's temperature replaces the
agent's, so the trainer's logprobs are those of the policy that sampled.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from typing import Any

from baton.agents.config import GatewayAgentConfig
from baton.batch import Batch
from baton.rollout.server import ServerThread
from baton.agents.tools import note_fault
from baton.agents.watchdog import Watch, run_watched
from baton.services.gateway import Gateway, Session
from baton.services.gateway_engines import InProcessEngine
from baton.services.gateway_rows import GatewayRows
from baton.user_modules import load_object


async def _one(gw: Gateway, s: Session, fn: Any, url: str, key: str, row: dict, watch: Watch) -> str | None:
    """Run the agent in session `s`; the reason it was dropped, or None when rewarded. Late
    is judged once, by the watchdog's clock at the claim (`Watch.late`), as the watchdog
    judges it: a session never keeps its reward while counted as dropped."""
    try:
        reward = await asyncio.wait_for(fn(f"{url}/sessions/{s.id}/v1", key, dict(row)),
                                        max(watch.deadline - time.monotonic(), 1e-9))
    except asyncio.TimeoutError:
        reason, why = "deadline", "the agent ran past gateway.session_timeout_s"
    except Exception as e:  # noqa: BLE001 - the agent's failure drops its session, counted
        reason, why = "agent_error", f"{type(e).__name__}: {e}"
    else:
        reason = "no_reward" if reward is None else ("no_turns" if not s.turns else None)
        why = "the agent returned None" if reward is None else "the agent returned without a model call"
    if not watch.claim():  # the watchdog gave up on it first (and dropped the session, noted)
        return "deadline"
    if watch.late:  # finished, but after the deadline: the watchdog counts (and notes) it as "deadline"
        gw.abort(s.id, "deadline")
        return "deadline"
    if reason is None:
        gw.set_reward(s.id, float(reward))
        return None
    note_fault(reason, why)
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
    work = [(gw.new_session(group=str(g)), row) for g, row in enumerate(plain) for _ in range(n)]

    def job(s: Session, row: dict):
        return lambda watch: _one(gw, s, fn, server.url, key, row, watch)

    def release(i: int) -> None:  # the agent's code still runs (it blocks its loop): drop its session
        gw.abort(work[i][0].id, "deadline")

    with ServerThread(gw.app(api_key=key)) as server:  # timeouts are counted (and logged) as "deadline"
        reasons, abandoned = run_watched([job(s, row) for s, row in work], cfg.session_timeout_s,
                                         give_up=lambda i, kind: kind, release=release, kind="deadline",
                                         name="baton-session")
    groups = len({int(s.group) for s in gw.sessions.values() if s.reward is not None})
    stats: dict[str, Any] = {"trajectories": len(reasons), "dropped": dict(Counter(r for r in reasons if r))}
    if abandoned:  # agents whose code never gave control back by the deadline: threads left behind
        stats["abandoned"] = abandoned
    if not groups:
        return Batch(meta={"agent_stats": stats})
    source = GatewayRows(gw, group_size=n, groups_per_step=groups, wait_s=0.0)
    out = source.rows(0)
    stats["boundary_mismatches"] = source.boundary_mismatches
    out.meta["agent_stats"] = stats
    return out
