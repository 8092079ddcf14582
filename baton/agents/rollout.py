"""Many agent trajectories at once, their turns batched through one engine.

    rows, stats = run_episodes(engine, tokenizer, prompts, n, cfg, params, group_offset=0)

Each (prompt, sample) is an asyncio task running its episode (baton.agents.episode); when
it needs the model it parks a request with the `TurnBatcher`. The batcher runs one engine
`generate` over every parked request as soon as no live trajectory is doing anything else
(all are parked, finished or dropped), so the turns of all trajectories go through the
engine together, with no timer: a trajectory busy in a tool holds the batch back only up to
its tool / env deadline. The engine runs in a thread so deadlines keep ticking meanwhile.

Faults (baton.agents.tools.AgentFault kinds tool_timeout / tool_error, and env_error,
env_timeout, trajectory_timeout, budget for truncation "drop") drop the trajectory: it is
counted in `stats["dropped"][kind]` and its group has fewer rows (`group_index` says which).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from baton import fields as F
from baton.agents.config import AgentConfig
from baton.agents.episode import AssistantTurn
from baton.agents.envs import AGENT_ENVS
from baton.agents.tokens import OBS, Trajectory
from baton.agents.tools import AgentFault, parse_tool_calls
from baton.batch import Batch
from baton.padding import pad_left, pad_right
from baton.protocol import Completion, SamplingParams


@dataclass
class Result:
    prompt_index: int
    traj: Trajectory | None = None
    final_reward: float = 0.0
    finish_reason: str = "stop"
    version: int = 0
    fault: str | None = None  # set: the trajectory is dropped


class TurnBatcher:
    """Collects generation requests of live trajectories; flushes when all are parked."""

    def __init__(self, engine: Any, params: SamplingParams, live: int):
        self.engine, self.params, self.live = engine, params, live
        self.pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.calls = 0
        self._running = False

    async def generate(self, ids: list[int], max_new: int) -> Completion:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((ids, max_new, fut))
        self._maybe_flush()
        return await fut

    def retire(self) -> None:
        """A trajectory finished or was dropped: it will not park again."""
        self.live -= 1
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if not self._running and self.pending and len(self.pending) >= self.live:
            self._running = True
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        batch, self.pending = self.pending, []
        try:
            by_len: dict[int, list] = {}
            for req in batch:
                by_len.setdefault(req[1], []).append(req)
            for max_new, reqs in by_len.items():
                self.calls += 1
                seed = None if self.params.seed is None else self.params.seed + 7919 * self.calls
                p = SamplingParams(n=1, temperature=self.params.temperature, top_p=self.params.top_p,
                                   top_k=self.params.top_k, max_new_tokens=max_new, seed=seed)
                done = await asyncio.to_thread(self.engine.generate, [r[0] for r in reqs], p)
                for c in done:
                    reqs[c.prompt_index][2].set_result(c)
        except Exception as e:  # noqa: BLE001 - every waiting trajectory sees the engine's error
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
        finally:
            self._running = False
            self._maybe_flush()


async def _episode(row: dict, index: int, cfg: AgentConfig, tokenizer: Any, template: str | None,
                   batcher: TurnBatcher, eos: set[int]) -> Result:
    env_cls = AGENT_ENVS[cfg.env]
    res = Result(index)
    ep = env_cls(row, tools=cfg.tools, tool_timeout_s=cfg.tool_timeout_s, **cfg.env_args)

    async def env_call(coro):
        try:
            return await asyncio.wait_for(coro, cfg.env_timeout_s)
        except asyncio.TimeoutError:
            raise AgentFault("env_timeout", f"env call ran past {cfg.env_timeout_s}s") from None
        except AgentFault:
            raise
        except Exception as e:  # noqa: BLE001 - counted, trajectory dropped
            raise AgentFault("env_error", f"{type(e).__name__}: {e}") from e

    try:
        start = await env_call(ep.start())
        traj = res.traj = Trajectory(tokenizer, list(start.messages), start.tools, template)
        res.version = None
        for _ in range(cfg.max_turns):
            left = cfg.max_tokens - traj.response_len
            if left <= 0:
                break
            c = await batcher.generate(traj.prompt_ids + traj.response()[0], min(cfg.turn_max_new_tokens, left))
            res.version = c.version if res.version is None else min(res.version, c.version)
            ids = c.token_ids
            body = ids[:-1] if c.finish_reason == "stop" and ids and ids[-1] in eos else ids
            content = tokenizer.decode(body, skip_special_tokens=False)
            traj.add_turn(ids, c.logprobs, content)
            calls, status, err = parse_tool_calls(content, ep.tools.names if ep.tools else frozenset())
            traj.statuses.append(status)
            obs = await env_call(ep.step(AssistantTurn(content, calls, status, err)))
            traj.turn_rewards.append(float(obs.reward or 0.0))
            if obs.done:
                res.final_reward = float(obs.final_reward)
                return res
            if c.finish_reason == "length" and traj.response_len >= cfg.max_tokens:
                break
            traj.add_observation(obs.messages)
            if traj.response_len > cfg.max_tokens:  # the observation does not fit
                seg = traj.segments.pop()
                assert seg.kind == OBS
                break
        # out of turns or tokens
        if cfg.truncation == "drop":
            raise AgentFault("budget", "out of turns or tokens")
        res.finish_reason = "length"
        traj.cut(cfg.max_tokens)
        return res
    finally:
        await ep.close()


async def _run_all(rows: list[dict], indices: list[int], cfg: AgentConfig, tokenizer: Any,
                   template: str | None, engine: Any, params: SamplingParams) -> list[Result]:
    batcher = TurnBatcher(engine, params, live=len(rows))
    eos = set(getattr(engine, "eos_token_ids", []) or [tokenizer.eos_token_id])

    async def one(row, i):
        try:
            return await asyncio.wait_for(_episode(row, i, cfg, tokenizer, template, batcher, eos),
                                          cfg.trajectory_timeout_s)
        except asyncio.TimeoutError:
            return Result(i, fault="trajectory_timeout")
        except AgentFault as e:
            return Result(i, fault=e.kind)
        finally:
            batcher.retire()

    return await asyncio.gather(*(one(r, i) for r, i in zip(rows, indices)))


def run_episodes(engine: Any, tokenizer: Any, prompts: Batch, n: int, cfg: AgentConfig,
                 params: SamplingParams, group_offset: int = 0) -> tuple[Batch, dict[str, Any]]:
    """n trajectories per prompt row of `prompts`; returns (rows, stats). Rows keep the
    prompt's task fields and carry `group_index` = group_offset + prompt row; dropped
    trajectories have no row."""
    template = Path(cfg.chat_template).read_text() if cfg.chat_template else None
    plain = [{k: prompts[k][i] for k in prompts.non_tensors} for i in range(len(prompts))]
    rows = [plain[i] for i in range(len(plain)) for _ in range(n)]
    idx = [i for i in range(len(plain)) for _ in range(n)]
    loop = asyncio.new_event_loop()
    try:
        results = loop.run_until_complete(_run_all(rows, idx, cfg, tokenizer, template, engine, params))
    finally:
        loop.close()  # not shutdown_default_executor: a hung sync tool keeps its thread
    return results_to_batch(prompts, results, tokenizer, group_offset)


def results_to_batch(prompts: Batch, results: list[Result], tokenizer: Any,
                     group_offset: int = 0) -> tuple[Batch, dict[str, Any]]:
    kept = [r for r in results if r.fault is None]
    stats: dict[str, Any] = {"trajectories": len(results), "dropped": dict(Counter(r.fault for r in results
                                                                                 if r.fault))}
    statuses = Counter(s for r in kept for s in r.traj.statuses)
    stats["tool_status"] = dict(statuses)
    stats["turns_mean"] = sum(r.traj.turns for r in kept) / max(len(kept), 1)
    stats["turn_reward_mean"] = sum(sum(r.traj.turn_rewards) for r in kept) / max(len(kept), 1)
    mismatches = Counter(m.kind for r in kept for m in r.traj.check())
    stats["token_mismatch"] = dict(mismatches)
    if not kept:
        return Batch(meta={"agent_stats": stats}), stats
    out = prompts.rows([r.prompt_index for r in kept])
    resp = [r.traj.response() for r in kept]
    pad = tokenizer.pad_token_id
    p_ids, p_mask = pad_left([r.traj.prompt_ids for r in kept], pad)
    r_ids, _ = pad_right([x[0] for x in resp], pad, torch.long)
    r_mask, _ = pad_right([x[1] for x in resp], 0, torch.long, width=r_ids.shape[1])
    r_lp, _ = pad_right([x[2] for x in resp], 0.0, torch.float32, width=r_ids.shape[1])
    tok_r = torch.zeros(r_ids.shape, dtype=torch.float32)
    turn_idx = torch.full(r_ids.shape, -1, dtype=torch.long)
    for b, r in enumerate(kept):
        ends = r.traj.turn_ends()
        start = 0
        for k, e in enumerate(ends):
            tok_r[b, e] += r.traj.turn_rewards[k] if k < len(r.traj.turn_rewards) else 0.0
            seg_mask = r_mask[b, start:e + 1].bool()
            turn_idx[b, start:e + 1][seg_mask] = k
            start = e + 1
        if ends:
            tok_r[b, ends[-1]] += r.final_reward
    out[F.PROMPT_IDS], out[F.PROMPT_MASK] = p_ids, p_mask
    out[F.RESPONSE_IDS], out[F.RESPONSE_MASK], out[F.ROLLOUT_LOGPROBS] = r_ids, r_mask, r_lp
    out[F.TOKEN_REWARDS] = tok_r
    out[F.REWARDS] = tok_r.sum(1)
    if F.GROUP_INDEX not in out:  # the source may number groups across ranks / steps itself
        out[F.GROUP_INDEX] = torch.tensor([group_offset + r.prompt_index for r in kept], dtype=torch.long)
    out[F.TURN_INDEX] = turn_idx
    out[F.NUM_TURNS] = torch.tensor([r.traj.turns for r in kept], dtype=torch.long)
    out[F.POLICY_VERSION] = torch.tensor([r.version or 0 for r in kept], dtype=torch.long)
    out[F.FINISH_REASON] = [r.finish_reason for r in kept]
    out[F.COMPLETION_TEXT] = [tokenizer.decode(x[0], skip_special_tokens=True) for x in resp]
    out[F.TOOL_STATUS] = [list(r.traj.statuses) for r in kept]
    out.meta["agent_stats"] = stats
    return out, stats


def agent_metrics(rows: Batch, stats: dict[str, Any], n_trajectories: int) -> dict[str, float]:
    """Accuracy (mean trajectory reward over ALL trajectories, a dropped one counting 0 here:
    evaluation, not training), the rate of well-formed tool calls among turns that tried one,
    and the rate of trajectories whose first turn called a tool correctly."""
    st = stats.get("tool_status", {})
    tried = sum(v for k, v in st.items() if k != "none")
    first_ok = sum(1 for s in (rows[F.TOOL_STATUS] if len(rows) else []) if s and s[0] == "ok")
    final = rows[F.TOKEN_REWARDS].sum().item() if len(rows) else 0.0
    return {"accuracy": final / max(n_trajectories, 1),
            "tool_call_ok": st.get("ok", 0) / max(tried, 1),
            "first_turn_call_ok": first_ok / max(n_trajectories, 1)}
