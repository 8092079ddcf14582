"""Request batching for `baton serve`: concurrent requests become one `engine.generate` call.

The engine is not thread safe and `generate` blocks, so all engine work (generation and
weight updates alike) goes through `EngineRunner`, one worker thread, keeping the event
loop free to accept requests. `Batcher` collects the requests that arrive while the engine
is busy (or within `max_wait_ms` of an idle engine), groups those with identical sampling
params (the engine takes one `SamplingParams` per call) and runs each group as one call,
up to `max_batch_seqs` sequences (prompts x n).

Seeded requests are never merged: a request's seed must give the same tokens whatever else
was in flight. A request whose client went away before its batch started is dropped
(its future is cancelled). Once every request of a running batch has been withdrawn, the
batch itself is cancelled between decode steps (`should_stop`, for engines whose `generate`
takes it, e.g. `EmbeddedEngine`), so a long generation nobody waits for frees the engine.

`EngineRunner.current` says which call runs on the engine thread and since when, and
`last_beat` when it last made progress (a decode step: the batcher's `should_stop` hook
beats): /health tells a busy engine (stepping) from a wedged one (no step for the deadline).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from baton.rollout.protocol import Completion, SamplingParams


class EngineRunner:
    """Runs engine calls one at a time on a dedicated thread."""

    def __init__(self, engine):
        self.engine = engine
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baton-engine")
        self.current: tuple[str, float] | None = None  # (label, time.monotonic() at start) while a call runs
        self.last_beat = 0.0  # time.monotonic() of the running call's last decode step
        try:
            self.cancellable = "should_stop" in inspect.signature(engine.generate).parameters
        except (TypeError, ValueError, AttributeError):
            self.cancellable = False

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def quiet_s(self) -> float | None:
        """Seconds since the running call started or last made progress (None: idle)."""
        current = self.current
        return None if current is None else time.monotonic() - max(current[1], self.last_beat)

    async def call(self, fn: Callable[..., Any], *args, label: str = "engine call", **kwargs) -> Any:
        def run() -> Any:
            self.current = (label, time.monotonic())
            try:
                return fn(*args, **kwargs)
            finally:
                self.current = None

        return await asyncio.get_running_loop().run_in_executor(self._pool, run)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclasses.dataclass
class _Item:
    prompts: list[list[int]]
    params: SamplingParams
    future: asyncio.Future


def _key(item: _Item) -> Any:
    """Items with equal keys may share one generate call."""
    p = item.params
    if p.seed is not None:
        return ("seeded", id(item))
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(dataclasses.asdict(p).items()))


class Batcher:
    def __init__(self, runner: EngineRunner, max_wait_ms: float = 2.0, max_batch_seqs: int = 256):
        self.runner = runner
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_batch_seqs = max_batch_seqs
        self.stats = {"requests": 0, "batches": 0, "dropped": 0, "cancelled": 0, "max_batch_requests": 0}
        self._pending: list[_Item] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def queued(self) -> int:
        return len(self._pending)

    async def submit(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Completions for `prompts` (prompt-major, prompt_index local to this request).
        Cancelling the awaiting task withdraws the request if its batch has not started."""
        self._ensure_task()
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(_Item(prompts, params, fut))
        self.stats["requests"] += 1
        self._wake.set()
        return await fut

    def _ensure_task(self) -> None:
        # Started lazily inside the serving loop (no reliance on lifespan events).
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            if self.max_wait_s > 0:
                await asyncio.sleep(self.max_wait_s)  # let near-simultaneous requests join
            self._wake.clear()
            items, self._pending = self._pending, []
            try:
                for batch in self._batches(items):
                    await self._run(batch)
            except Exception as exc:  # noqa: BLE001 - a bug here must fail requests, not hang them
                for it in items:
                    if not it.future.done():
                        it.future.set_exception(exc)

    def _batches(self, items: list[_Item]) -> list[list[_Item]]:
        groups: dict[Any, list[list[_Item]]] = {}
        for it in items:
            seqs = len(it.prompts) * it.params.n
            batches = groups.setdefault(_key(it), [[]])
            cur = batches[-1]
            if cur and sum(len(x.prompts) for x in cur) * it.params.n + seqs > self.max_batch_seqs:
                batches.append(cur := [])
            cur.append(it)
        return [b for batches in groups.values() for b in batches]

    async def _run(self, batch: list[_Item]) -> None:
        live = [it for it in batch if not it.future.done()]  # cancelled: client left while queued
        self.stats["dropped"] += len(batch) - len(live)
        if not live:
            return
        prompts = [p for it in live for p in it.prompts]
        self.stats["batches"] += 1
        self.stats["max_batch_requests"] = max(self.stats["max_batch_requests"], len(live))
        kwargs = {}
        if self.runner.cancellable:
            stop = threading.Event()  # set on the loop, polled by the engine thread

            def withdrawn(_fut: asyncio.Future) -> None:
                if all(it.future.cancelled() for it in live):
                    stop.set()

            for it in live:
                it.future.add_done_callback(withdrawn)
            runner = self.runner

            def should_stop() -> bool:  # polled by the engine thread before each step
                runner.beat()
                return stop.is_set()
            kwargs["should_stop"] = should_stop
        try:
            outs = await self.runner.call(self.runner.engine.generate, prompts, live[0].params, label="generate",
                                          **kwargs)
        except Exception as exc:  # noqa: BLE001 - handed to every waiting request
            if all(it.future.cancelled() for it in live):
                self.stats["cancelled"] += 1
            for it in live:
                if not it.future.done():
                    it.future.set_exception(exc)
            return
        by_prompt: list[list[Completion]] = [[] for _ in prompts]
        for c in outs:
            by_prompt[c.prompt_index].append(c)
        offset = 0
        for it in live:
            mine = []
            for local in range(len(it.prompts)):
                mine += [dataclasses.replace(c, prompt_index=local) for c in by_prompt[offset + local]]
            offset += len(it.prompts)
            if not it.future.done():
                it.future.set_result(mine)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        for it in self._pending:
            if not it.future.done():
                it.future.cancel()
