"""Agents' code off the caller's thread, with deadlines that hold even when it blocks its loop.

    results, abandoned = run_watched(jobs, deadline_s, give_up, release=...)
    # jobs[i]: async (watch) -> result, each run in a daemon thread with an event loop of its own
    # give_up(i, kind): the result of job i when it timed out; release(i): the watchdog
    # abandoned job i (it claimed it: the job's own clean-up will not run)

An agent's code (an env's `step`, a tool, an OpenAI-speaking agent) may block its event loop
(`time.sleep` inside `async def`, a CPU-bound parse): `asyncio.wait_for` cannot fire then,
and on a loop shared by every trajectory one such agent stalls them all. So each job runs on a
loop of its own, in a daemon thread, and the calling thread is the watchdog: it waits for
the jobs and gives up on one

  - at the whole deadline (`deadline_s` from the start: kind "trajectory_timeout" unless the
    caller names another), or
  - at the deadline of the phase the job declared it is in (`watch.phase(timeout_s, kind)`,
    e.g. an env step: kind "env_timeout"), so that a job blocked in one phase frees the
    others (an episode's turns are batched with its siblings') long before the whole
    deadline,

each after `grace_s`, which lets a job whose loop is free time itself out (its own
`wait_for`, its `finally` blocks run). A job abandoned keeps its thread, a daemon: it never
keeps the process from exiting, and nothing it does later is read. A result that arrives
after the whole deadline is a timeout too (`late`), so the deadline holds exactly.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator

import torch

from baton.agents.tools import note_fault
from baton.http import quiet_clients_left_open

GRACE_S = 0.5
POLL_S = 0.1  # how often the watchdog looks at the phases the jobs entered meanwhile


class Watch:
    """One job's state as the watchdog sees it. `claim()` is True for whoever ends the job
    first (the job itself, or the watchdog giving up on it): only that one may retire it.
    `deadline` is the watchdog's whole deadline (one clock for both sides): a job that claims
    after it is `late`, and the watchdog counts it a timeout, so a job with side effects (a
    gateway session's reward) decides by `late` after its claim, never by a clock of its own."""

    def __init__(self, deadline: float = float("inf")) -> None:
        self.deadline = deadline  # monotonic time by which the whole job must have ended
        self.phase_deadline: float | None = None  # monotonic time by which the current phase ends
        self.phase_kind = ""
        self.finished_at: float | None = None
        self.claimed_at: float | None = None
        self._claimed = False
        self._lock = threading.Lock()

    @property
    def late(self) -> bool:
        """Whether the job ended (claimed, else finished) after the whole deadline."""
        end = self.claimed_at if self.claimed_at is not None else self.finished_at
        return end is not None and end > self.deadline

    @contextmanager
    def phase(self, timeout_s: float, kind: str) -> Iterator[None]:
        """The job is in a phase that must end within timeout_s, else it is abandoned as `kind`."""
        self.phase_deadline, self.phase_kind = time.monotonic() + timeout_s, kind
        try:
            yield
        finally:
            self.phase_deadline = None

    def claim(self) -> bool:
        with self._lock:
            first, self._claimed = not self._claimed, True
            if first:
                self.claimed_at = time.monotonic()
            return first


def _thread(job: Callable[[Watch], Awaitable[Any]], watch: Watch, out: Future, threads: int) -> None:
    torch.set_num_threads(threads)  # the caller's: a new thread would start with OpenMP's default
    loop = asyncio.new_event_loop()
    quiet_clients_left_open(loop)
    try:
        result = loop.run_until_complete(job(watch))
    except BaseException as e:  # noqa: BLE001 - handed to the watchdog, which re-raises it
        watch.finished_at = time.monotonic()
        out.set_exception(e)
    else:
        watch.finished_at = time.monotonic()
        out.set_result(result)
    finally:
        loop.close()  # not shutdown_default_executor: a hung helper thread keeps its own


def run_watched(jobs: list[Callable[[Watch], Awaitable[Any]]], deadline_s: float,
                give_up: Callable[[int, str], Any], release: Callable[[int], None] = lambda i: None,
                kind: str = "trajectory_timeout", grace_s: float = GRACE_S,
                name: str = "baton-agent") -> tuple[list[Any], int]:
    """(results in job order, how many jobs were abandoned with their thread still running).
    A job's exception is re-raised here (jobs catch their agent's faults themselves)."""
    start = time.monotonic()
    deadline = start + deadline_s
    watches = [Watch(deadline) for _ in jobs]
    futures = [Future() for _ in jobs]
    for i, job in enumerate(jobs):
        threading.Thread(target=_thread, args=(job, watches[i], futures[i], torch.get_num_threads()), name=f"{name}-{i}",
                         daemon=True).start()
    results: list[Any] = [None] * len(jobs)
    pending = set(range(len(jobs)))
    abandoned = 0
    while pending:
        now = time.monotonic()
        for i in sorted(pending):
            w, f = watches[i], futures[i]
            if f.done():
                pending.discard(i)
                results[i] = f.result()
                if w.late:  # ended after the deadline (as the job itself saw it): a timeout
                    note_fault(kind, "finished after its deadline")
                    results[i] = give_up(i, kind)
                continue
            over = now > deadline + grace_s
            stuck = w.phase_deadline is not None and now > w.phase_deadline + grace_s
            if (over or stuck) and w.claim():
                pending.discard(i)
                abandoned += 1
                release(i)
                why = kind if over else w.phase_kind
                note_fault(why, f"its code still ran {grace_s}s past its deadline (it blocks its event loop?): "
                                f"abandoned, its thread left running")
                results[i] = give_up(i, why)
        if not pending:
            break
        wakes = [deadline + grace_s] + [w.phase_deadline + grace_s for i in pending
                                        if (w := watches[i]).phase_deadline is not None]
        wait([futures[i] for i in pending], timeout=min(max(0.0, min(wakes) - time.monotonic()) + 0.01, POLL_S),
             return_when=FIRST_COMPLETED)
    return results, abandoned
