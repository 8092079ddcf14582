"""Many agent trajectories at once, their turns batched through one engine.

    rows, stats = run_episodes(engine, tokenizer, prompts, n, cfg, params, group_offset=0)

Each (prompt, sample) runs its episode (baton.agents.episode) on an event loop and daemon
thread of its own, under a watchdog (baton.agents.watchdog): an env that blocks its loop
(`time.sleep` in `async def step`) is abandoned at its env deadline, every trajectory at
`trajectory_timeout_s`, and neither holds the others back nor keeps the process alive. When
a trajectory needs the model it parks a request with the `TurnBatcher`, which runs one engine
`generate` over every parked request as soon as no live trajectory is doing anything else
(all are parked, finished or dropped), so the turns of all trajectories go through the
engine together, with no timer: a trajectory busy in a tool holds the batch back only up to
its tool / env deadline. The engine runs in a thread of its own.

Faults (baton.agents.tools.AgentFault kinds tool_timeout / tool_error, and env_error,
env_timeout, trajectory_timeout, budget / context for truncation "drop") drop the trajectory:
it is counted in `stats["dropped"][kind]` and its group has fewer rows (`group_index` says
which). `stats["abandoned"]`: trajectories whose code was still running at its deadline
(threads left behind); `stats["cut"]`: observations cut to `max_observation_chars`
("observation") and trajectories ended because the model's context was full ("context",
finish_reason "length"). Both appear only when non-zero.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from baton import fields as F
from baton.agents.config import AgentConfig
from baton.agents.episode import AssistantTurn, Observation
from baton.agents.envs import AGENT_ENVS
from baton.agents.tokens import OBS, Conversation
from baton.agents.tools import AgentFault, note_fault, parse_tool_calls
from baton.agents.watchdog import Watch, run_watched
from baton.batch import Batch
from baton.protocol import Completion, SamplingParams
from baton.rollout.engines import context_len
from baton.rows import COLUMNS, Column, group_ids, to_batch
from baton.rows import Trajectory as Row


@dataclass
class Result:
    prompt_index: int
    traj: Conversation | None = None
    final_reward: float = 0.0
    finish_reason: str = "stop"
    version: int = 0
    fault: str | None = None  # set: the trajectory is dropped
    cut: Counter = field(default_factory=Counter)  # observation: messages cut; context: ended by it


class TurnBatcher:
    """Collects generation requests of live trajectories (each on a thread and event loop of
    its own, `baton.agents.watchdog`); when all are parked, runs one engine call over them in
    a thread of its own. `close()`: no engine call starts any more; waits for the one running
    (the engine's own work, bounded by max_new_tokens)."""

    def __init__(self, engine: Any, params: SamplingParams, live: int):
        self.engine, self.params, self.live = engine, params, live
        self.pending: list[tuple[list[int], int, Future, int]] = []  # (ids, max_new, result, key)
        self.calls = 0
        self._running = self._closed = False
        self._lock = threading.Condition()
        # the engine's owner's torch (OpenMP) thread count: the engine runs in a thread of
        # ours, which would start with OpenMP's default (vLLM's CPU attention refuses a count
        # other than the one its metadata was built with)
        self.threads = torch.get_num_threads()

    async def generate(self, ids: list[int], max_new: int, key: int = 0) -> Completion:
        """One turn of trajectory `key`: requests go to the engine in the order of their keys,
        whichever thread parked first, so a seeded run samples the same."""
        return await asyncio.wrap_future(self.submit(ids, max_new, key))

    def submit(self, ids: list[int], max_new: int, key: int = 0) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._closed:
                fut.set_exception(AgentFault("trajectory_timeout", "the step's episodes are over"))
                return fut
            self.pending.append((ids, max_new, fut, key))
            batch = self._take()
        self._start(batch)
        return fut

    def retire(self) -> None:
        """A trajectory finished or was dropped: it will not park again."""
        with self._lock:
            self.live -= 1
            batch = self._take()
        self._start(batch)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            while self._running:
                self._lock.wait()

    def _take(self) -> list | None:
        """Under the lock: the parked requests, once every live trajectory has parked."""
        self.pending = [r for r in self.pending if not r[2].done()]  # cancelled by a timed-out trajectory
        if self._running or self._closed or not self.pending or len(self.pending) < self.live:
            return None
        self._running = True
        batch, self.pending = self.pending, []
        return batch

    def _start(self, batch: list | None) -> None:
        if batch:
            threading.Thread(target=self._run, args=(batch,), name="baton-turns", daemon=True).start()

    def _run(self, batch: list | None) -> None:
        torch.set_num_threads(self.threads)
        torch.get_num_threads()  # initializes this thread's OpenMP settings before the engine reads them
        while batch:
            self._flush(batch)
            with self._lock:
                self._running = False
                batch = self._take()
                self._lock.notify_all()

    def _flush(self, batch: list) -> None:
        try:
            by_len: dict[int, list] = {}
            for req in sorted(batch, key=lambda r: r[3]):
                by_len.setdefault(req[1], []).append(req)
            for max_new, reqs in by_len.items():
                self.calls += 1
                seed = None if self.params.seed is None else self.params.seed + 7919 * self.calls
                p = SamplingParams(n=1, temperature=self.params.temperature, top_p=self.params.top_p,
                                   top_k=self.params.top_k, max_new_tokens=max_new, seed=seed)
                for c in self.engine.generate([r[0] for r in reqs], p):
                    _settle(reqs[c.prompt_index][2], c)
        except Exception as e:  # noqa: BLE001 - every waiting trajectory sees the engine's error
            for _, _, fut, _ in batch:
                _settle(fut, error=e)


def _settle(fut: Future, value: Any = None, error: BaseException | None = None) -> None:
    try:
        fut.set_exception(error) if error is not None else fut.set_result(value)
    except InvalidStateError:  # its trajectory timed out meanwhile (cancelled) or was settled
        pass


def cap_observation(obs: Observation, max_chars: int) -> int:
    """Cut every observation message longer than max_chars, with a marker the model reads
    (a tool that returns 10 MB); returns how many were cut."""
    cut = 0
    for k, m in enumerate(obs.messages):
        text = m.get("content")
        if isinstance(text, str) and len(text) > max_chars:
            obs.messages[k] = {**m, "content": text[:max_chars] + f"\n[... {len(text) - max_chars} characters cut]"}
            cut += 1
    return cut


async def _episode(row: dict, res: Result, cfg: AgentConfig, tokenizer: Any, template: str | None,
                   batcher: TurnBatcher, watch: Watch, ctx: int | None, eos: set[int], key: int) -> Result:
    env_cls = AGENT_ENVS[cfg.env]
    ep = env_cls(row, tools=cfg.tools, tool_timeout_s=cfg.tool_timeout_s, **cfg.env_args)

    async def env_call(coro):
        with watch.phase(cfg.env_timeout_s, "env_timeout"):  # held even if the env blocks its loop
            try:
                return await asyncio.wait_for(coro, cfg.env_timeout_s)
            except asyncio.TimeoutError:
                raise AgentFault("env_timeout", f"env call ran past {cfg.env_timeout_s}s") from None
            except AgentFault:
                raise
            except Exception as e:  # noqa: BLE001 - counted, trajectory dropped
                raise AgentFault("env_error", f"{type(e).__name__}: {e}") from e

    out_of = "budget"
    try:
        start = await env_call(ep.start())
        traj = res.traj = Conversation(tokenizer, list(start.messages), start.tools, template)
        res.version = None
        for _ in range(cfg.max_turns):
            ids = traj.prompt_ids + traj.response()[0]
            left = cfg.max_tokens - traj.response_len
            room = left if ctx is None else min(left, ctx - len(ids))
            if room <= 0:
                out_of = "budget" if left <= 0 else "context"
                break
            c = await batcher.generate(ids, min(cfg.turn_max_new_tokens, room), key)
            res.version = c.version if res.version is None else min(res.version, c.version)
            ids = c.token_ids
            body = ids[:-1] if c.finish_reason == "stop" and ids and ids[-1] in eos else ids
            content = tokenizer.decode(body, skip_special_tokens=False)
            traj.add_turn(ids, c.logprobs, content, c.version)
            calls, status, err = parse_tool_calls(content, ep.tools.names if ep.tools else frozenset())
            traj.statuses.append(status)
            obs = await env_call(ep.step(AssistantTurn(content, calls, status, err)))
            traj.turn_rewards.append(float(obs.reward or 0.0))
            if obs.done:
                res.final_reward = float(obs.final_reward)
                return res
            if c.finish_reason == "length" and traj.response_len >= cfg.max_tokens:
                break
            res.cut["observation"] += cap_observation(obs, cfg.max_observation_chars)
            traj.add_observation(obs.messages)
            if traj.response_len > cfg.max_tokens:  # the observation does not fit
                seg = traj.segments.pop()
                assert seg.kind == OBS
                break
        # out of turns or tokens, or the model's context is full
        if cfg.truncation == "drop":
            raise AgentFault(out_of, "out of turns or tokens" if out_of == "budget" else "the model's context is full")
        res.cut[out_of] += out_of == "context"
        res.finish_reason = "length"
        traj.cut(cfg.max_tokens)
        return res
    finally:
        await ep.close()


def _run_all(rows: list[dict], indices: list[int], cfg: AgentConfig, tokenizer: Any,
             template: str | None, engine: Any, params: SamplingParams) -> tuple[list[Result], int]:
    """Every trajectory on a thread and loop of its own under the watchdog (module docstring);
    (results, trajectories abandoned with their code still running)."""
    batcher = TurnBatcher(engine, params, live=len(rows))
    ctx = context_len(engine)
    eos = set(engine.eos_token_ids or [tokenizer.eos_token_id])

    def job(row: dict, i: int, key: int):
        async def run(watch: Watch) -> Result:
            res = Result(i)
            try:
                episode = _episode(row, res, cfg, tokenizer, template, batcher, watch, ctx, eos, key)
                return await asyncio.wait_for(episode, cfg.trajectory_timeout_s)
            except asyncio.TimeoutError:
                note_fault("trajectory_timeout", f"a trajectory ran past {cfg.trajectory_timeout_s}s")
                return Result(i, fault="trajectory_timeout", cut=res.cut)
            except AgentFault as e:
                note_fault(e.kind, e.message)
                return Result(i, fault=e.kind, cut=res.cut)
            finally:
                if watch.claim():
                    batcher.retire()
        return run

    try:
        return run_watched([job(r, i, k) for k, (r, i) in enumerate(zip(rows, indices))], cfg.trajectory_timeout_s,
                           give_up=lambda k, kind: Result(indices[k], fault=kind), release=lambda k: batcher.retire())
    finally:
        batcher.close()


_PREPARED: set[str] = set()  # envs whose prepare() ran in this process
_PREPARE_LOCK = threading.Lock()


def prepare_env(name: str) -> None:
    """The env class's `prepare()` (an attribute, if it has one), once per process, before any
    trajectory's deadline starts (as rewards' `prepare`): a slow import (openenv: 4.5 s of CPU)
    inside `start` would run under `agent.env_timeout_s`, with every trajectory thread queued
    on the import lock, and each fault would then read as a timeout."""
    with _PREPARE_LOCK:
        if name in _PREPARED:
            return
        ready = getattr(AGENT_ENVS[name], "prepare", None)
        if callable(ready):
            ready()
        _PREPARED.add(name)


def run_episodes(engine: Any, tokenizer: Any, prompts: Batch, n: int, cfg: AgentConfig,
                 params: SamplingParams, group_offset: int = 0) -> tuple[Batch, dict[str, Any]]:
    """n trajectories per prompt row of `prompts`; returns (rows, stats). Rows keep the
    prompt's task fields and carry `group_index` = group_offset + prompt row; dropped
    trajectories have no row."""
    template = Path(cfg.chat_template).read_text() if cfg.chat_template else None
    prepare_env(cfg.env)
    plain = [{k: prompts[k][i] for k in prompts.non_tensors} for i in range(len(prompts))]
    rows = [plain[i] for i in range(len(plain)) for _ in range(n)]
    idx = [i for i in range(len(plain)) for _ in range(n)]
    results, abandoned = _run_all(rows, idx, cfg, tokenizer, template, engine, params)
    out, stats = results_to_batch(prompts, results, tokenizer, group_offset)
    if abandoned:  # their code never gave control back by the deadline: threads left behind
        stats["abandoned"] = abandoned
    return out, stats


def results_to_batch(prompts: Batch, results: list[Result], tokenizer: Any,
                     group_offset: int = 0) -> tuple[Batch, dict[str, Any]]:
    kept = [r for r in results if r.fault is None]
    stats: dict[str, Any] = {"trajectories": len(results), "dropped": dict(Counter(r.fault for r in results
                                                                                 if r.fault))}
    cut = sum((r.cut for r in results), Counter())
    if cut:  # observations cut to agent.max_observation_chars, trajectories ended by the context
        stats["cut"] = dict(cut)
    statuses = Counter(s for r in kept for s in r.traj.statuses)
    stats["tool_status"] = dict(statuses)
    stats["turns_mean"] = sum(r.traj.turns for r in kept) / max(len(kept), 1)
    stats["turn_reward_mean"] = sum(sum(r.traj.turn_rewards) for r in kept) / max(len(kept), 1)
    mismatches = Counter(m.kind for r in kept for m in r.traj.check())
    stats["token_mismatch"] = dict(mismatches)
    if not kept:
        return Batch(meta={"agent_stats": stats}), stats
    groups = group_ids(prompts, group_offset)  # the source may number groups across ranks / steps itself
    out = to_batch([row_of(r, groups[r.prompt_index]) for r in kept], tokenizer.pad_token_id, tokenizer,
                   prompts=prompts, columns=(*COLUMNS, *AGENT_COLUMNS))
    out.meta["agent_stats"] = stats
    return out, stats


AGENT_COLUMNS = (Column("turn_index", F.TURN_INDEX, -1, torch.long),
                 Column("num_turns", F.NUM_TURNS, 0, torch.long, per_token=False))


def row_of(r: Result, group: int) -> Row:
    """A kept episode as a training row: its turns' rewards on each turn's last policy token,
    the final reward on the last one; each response token's turn and the weight version that
    sampled it (-1 off the policy); its `version` the oldest turn's."""
    ids, mask, logprobs = r.traj.response()
    ends = r.traj.turn_ends()
    rewards = [(e, r.traj.turn_rewards[k] if k < len(r.traj.turn_rewards) else 0.0) for k, e in enumerate(ends)]
    if ends:
        rewards.append((ends[-1], r.final_reward))
    turn = [-1] * len(ids)
    start = 0
    for k, e in enumerate(ends):
        for j in range(start, min(e + 1, len(ids))):
            if mask[j]:
                turn[j] = k
        start = e + 1
    return Row(r.traj.prompt_ids, ids, logprobs=logprobs, loss_mask=mask, token_rewards=rewards,
               version=r.version or 0, token_versions=r.traj.versions(), finish_reason=r.finish_reason,
               group=group, prompt_row=r.prompt_index,
               extra={"turn_index": turn, "num_turns": r.traj.turns, F.TOOL_STATUS: list(r.traj.statuses)})


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
