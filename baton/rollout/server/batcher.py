"""Request scheduling for `baton serve`: concurrent requests become `engine.generate` calls,
and a long generation never holds the engine for itself.

The engine is not thread safe and `generate` blocks, so all engine work (generation and
weight updates alike) goes through `EngineRunner`, one worker thread, keeping the event
loop free to accept requests. `Batcher` collects the requests that arrive while the engine
is busy (or within `max_wait_ms` of an idle engine), groups those with identical sampling
params (the engine takes one `SamplingParams` per call), up to `max_batch_seqs` sequences
(prompts x n), and makes each group one generation.

Fair interleaving: an engine with `start_generation` (`EmbeddedEngine`; its `generate` not
overridden by a subclass) runs each generation `slice_steps` decode steps at a time, its KV
cache put aside in between. Up to `max_running` generations take turns, round robin, and a
request that arrives meanwhile starts at the next slice boundary: a 4-token request waits
for at most one slice of each running generation, not for a 30,000-token one to end. A
generation runs exactly the steps it would run alone, so its tokens are the same (greedy
or seeded). The engine does not add rows to a running decode batch (its static KV cache
is left-padded to one slot), so requests of different lengths take turns rather than
share steps. Other engines run each generation as one `generate` call, in turn.

Seeded requests are never merged: a request's seed must give the same tokens whatever else
was in flight. A request whose client went away before its generation started is dropped
(its future is cancelled). Once every request of a running generation has been withdrawn
it is dropped at the next slice boundary, or between decode steps (`should_stop`, for
engines whose `generate` takes it), so a long generation nobody waits for frees the engine.
`paused()` lets the running generations finish and starts no new one (weight updates and
sleep run then, so a generation never mixes two versions of the weights).

Streaming (`submit(on_progress=...)`): after every decode step of a generation that a
streamed request shares, the engine thread reads its new tokens (`Generation.partial`: one
host read of the steps since the last, so on a GPU a streamed generation syncs every step)
and posts them to the event loop; it never waits for the stream.

`EngineRunner.current` says which call runs on the engine thread and since when, and
`last_beat` when it last made progress (a decode step: the batcher's `should_stop` hook
beats): /health tells a busy engine (stepping) from a wedged one (no step for the deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from baton.protocol import Completion, SamplingParams

DEFAULT_SLICE_STEPS = 16
DEFAULT_MAX_RUNNING = 8


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
    on_progress: Callable[[list[tuple[list[int], bool]]], None] | None = None  # streaming (submit)


@dataclasses.dataclass
class _Job:
    """One generation: requests with equal sampling params, their prompts concatenated."""
    items: list[_Item]
    gen: Any = None  # the engine's `Generation` once started (sliced engines)
    started: float | None = None  # time.monotonic() of its first slice
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)  # all clients left


def _key(item: _Item) -> Any:
    """Items with equal keys may share one generate call."""
    p = item.params
    if p.seed is not None:
        return ("seeded", id(item))
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(dataclasses.asdict(p).items()))


def sliceable(engine: Any) -> bool:
    """True when `engine` runs a generation in slices (`start_generation`) and its
    `generate` is the one that class defines (a subclass wrapping `generate` is served
    through its wrapper, as one call)."""
    cls = type(engine)
    for base in cls.__mro__:
        if "start_generation" in vars(base):
            return getattr(cls, "generate", None) is vars(base).get("generate")
    return False


class Batcher:
    def __init__(self, runner: EngineRunner, max_wait_ms: float = 2.0, max_batch_seqs: int = 256,
                 slice_steps: int = DEFAULT_SLICE_STEPS, max_running: int = DEFAULT_MAX_RUNNING):
        if slice_steps < 0 or max_running < 1:
            raise ValueError(f"slice_steps must be >= 0 (0: no slicing) and max_running >= 1, "
                             f"got {slice_steps}, {max_running}")
        self.runner = runner
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_batch_seqs = max_batch_seqs
        self.sliced = slice_steps > 0 and sliceable(runner.engine)
        self.slice_steps = slice_steps if self.sliced else None
        self.max_running = max_running if self.sliced else 2**31  # whole calls run one after another
        self.stats = {"requests": 0, "batches": 0, "dropped": 0, "cancelled": 0, "max_batch_requests": 0,
                      "slices": 0, "max_running": 0}
        self._pending: list[_Item] = []
        self._running: list[_Job] = []
        self._paused = 0
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def queued(self) -> int:
        """Requests waiting for their generation to start."""
        return len(self._pending) + sum(len(j.items) for j in self._running if j.started is None)

    @property
    def running(self) -> int:
        """Requests whose generation has started and not finished."""
        return sum(len(j.items) for j in self._running if j.started is not None)

    def oldest_start(self) -> float | None:
        """time.monotonic() at which the oldest running generation started (None: none)."""
        return min((j.started for j in self._running if j.started is not None), default=None)

    async def submit(self, prompts: list[list[int]], params: SamplingParams,
                     on_progress: Callable[[list[tuple[list[int], bool]]], None] | None = None) -> list[Completion]:
        """Completions for `prompts` (prompt-major, prompt_index local to this request).
        Cancelling the awaiting task withdraws the request if its batch has not started.
        `on_progress(rows)`: called on the event loop as a sliced engine's generation steps
        with, per sample row (prompt-major), the tokens new since the last call and whether
        the row has stopped (`Generation.partial`, read on the engine thread after each
        decode step and posted to the loop: the engine never waits for the stream), so a
        stream's first chunk waits for a prefill and one decode step."""
        self._ensure_task()
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(_Item(prompts, params, fut, on_progress))
        self.stats["requests"] += 1
        self._wake.set()
        return await fut

    @contextlib.asynccontextmanager
    async def paused(self):
        """Lets the running generations finish, starts no new one until the block ends."""
        self._paused += 1
        try:
            while self._running and self._task is not None and not self._task.done():
                self._idle.clear()
                await self._idle.wait()
            yield
        finally:
            self._paused -= 1
            if self._wake is not None:
                self._wake.set()

    def _ensure_task(self) -> None:
        # Started lazily inside the serving loop (no reliance on lifespan events).
        if self._task is None or self._task.done():
            self._wake, self._idle = asyncio.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            if not self._running:
                self._idle.set()
                await self._wake.wait()
                if self.max_wait_s > 0:
                    await asyncio.sleep(self.max_wait_s)  # let near-simultaneous requests join
            self._wake.clear()
            try:
                self._admit()
                if not self._running:
                    continue
                job = self._running[0]  # stays listed while it runs (/health counts it)
                more = await self._slice(job)
                self._running.remove(job)
                if more:
                    self._admit(reserve=1)  # what arrived during the slice goes before it: round robin
                    self._running.append(job)
            except Exception as exc:  # noqa: BLE001 - a bug here must fail requests, not hang them
                for j in self._running:
                    for it in j.items:
                        if not it.future.done():
                            it.future.set_exception(exc)
                self._running = []

    def _admit(self, reserve: int = 0) -> None:
        """Pending requests -> generations, while fewer than max_running (less `reserve`
        places) run; the rest wait, in order."""
        if self._paused or not self._pending:
            return
        items, self._pending = self._pending, []
        for batch in self._batches(items):
            if len(self._running) + reserve < self.max_running:
                self._running.append(_Job(batch))
            else:
                self._pending += batch
        self.stats["max_running"] = max(self.stats["max_running"], len(self._running) + reserve)

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

    def _start(self, job: _Job) -> bool:
        """Before a job's first slice: drop the requests already withdrawn. False: none left."""
        live = [it for it in job.items if not it.future.done()]  # cancelled: client left while queued
        self.stats["dropped"] += len(job.items) - len(live)
        job.items = live
        if not live:
            return False
        job.started = time.monotonic()
        self.stats["batches"] += 1
        self.stats["max_batch_requests"] = max(self.stats["max_batch_requests"], len(live))

        def withdrawn(_fut: asyncio.Future) -> None:
            if all(it.future.cancelled() for it in live):
                job.stop.set()

        for it in live:
            it.future.add_done_callback(withdrawn)
        return True

    async def _slice(self, job: _Job) -> bool:
        """Run one slice of `job` on the engine (all of it for engines that do not slice).
        True: it has more to run."""
        if job.started is None and not self._start(job):
            return False
        if job.stop.is_set():  # every client left between slices
            if job.gen is not None:
                job.gen.close()
            self.stats["cancelled"] += 1
            return False
        engine, runner, params = self.runner.engine, self.runner, job.items[0].params
        prompts = [p for it in job.items for p in it.prompts]
        kwargs = {}
        if self.sliced or runner.cancellable:
            def should_stop() -> bool:  # polled by the engine thread before each step
                runner.beat()
                return job.stop.is_set()
            kwargs["should_stop"] = should_stop

        post = None
        if self.sliced and any(it.on_progress is not None for it in job.items):
            loop = asyncio.get_running_loop()

            def post() -> None:  # on the engine thread, after a step: the new tokens to the loop
                rows = job.gen.partial()
                if any(toks for toks, _ in rows):
                    loop.call_soon_threadsafe(self._progress, job, params.n, rows)

        def step() -> list[Completion] | None:
            if not self.sliced:
                return engine.generate(prompts, params, **kwargs)
            if job.gen is None:
                job.gen = engine.start_generation(prompts, params, **kwargs)
            return job.gen.result if job.gen.advance(self.slice_steps, on_step=post) else None

        try:
            outs = await runner.call(step, label="generate")
        except Exception as exc:  # noqa: BLE001 - handed to every waiting request
            if job.stop.is_set():
                self.stats["cancelled"] += 1
            for it in job.items:
                if not it.future.done():
                    it.future.set_exception(exc)
            return False
        self.stats["slices"] += 1
        if outs is None:
            return True
        self._deliver(job, prompts, outs)
        return False

    @staticmethod
    def _progress(job: _Job, n: int, rows: list[tuple[list[int], bool]]) -> None:
        """Hands each streaming request its own rows of a step's `Generation.partial`."""
        offset = 0
        for it in job.items:
            mine = rows[offset * n:(offset + len(it.prompts)) * n]
            offset += len(it.prompts)
            if it.on_progress is not None and not it.future.done() and any(toks for toks, _ in mine):
                it.on_progress(mine)

    @staticmethod
    def _deliver(job: _Job, prompts: list[list[int]], outs: list[Completion]) -> None:
        by_prompt: list[list[Completion]] = [[] for _ in prompts]
        for c in outs:
            by_prompt[c.prompt_index].append(c)
        offset = 0
        for it in job.items:
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
        for it in self._pending + [it for j in self._running for it in j.items]:
            if not it.future.done():
                it.future.cancel()
        self._running = []
