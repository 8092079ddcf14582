"""Run reward functions over completions: weights, per-call deadlines, and failures that never end a run.

A reward function has the TRL-style signature `reward(prompt, completion, **row) -> float`,
where `row` carries the dataset fields of the sample (e.g. `answer`). Functions are named
in config either by a registered name (`REWARD_FUNCTIONS`, which tasks fill when their
module is imported) or by an import path `package.module:function`.

Every call has its own deadline (`timeout_s`, counted from when the call starts). A call
that fails scores 0 for that sample and is counted per sample in `RewardStats`:
  * `errors`: it raised - any BaseException, SystemExit and KeyboardInterrupt included - or
    its worker process died under it (os._exit, a segfault, a signal);
  * `timeouts`: it ran past its deadline;
  * `nonfinite`: it returned NaN, +-inf, or something `float()` rejects.
The first message of each kind in a batch is logged; the step goes on.

Where the calls run (`sandbox=`):
  * "process": a pool of `max_workers` worker processes (`baton.rewards.pool`). A call past
    its deadline gets its process SIGKILLed and replaced; the other calls never wait for
    it, and nothing waits for it at exit. This is the only way to stop a hung call (even
    one stuck in C code holding the GIL, like a runaway regex) and it isolates verifier
    code that exits, crashes or leaks. Calls are sent in chunks (a few per worker per
    `score()`); each call's start time and result go into a buffer shared with the worker,
    so the runner still knows which call hung and keeps the results before it.
  * "thread": daemon threads in this process, for functions that a fresh interpreter cannot
    load (closures, anything defined in `__main__`, unpicklable objects). Deadlines are per
    call and a hung call never blocks the others or the exit, but its thread cannot be
    stopped: it is abandoned (and replaced) and keeps its CPU until the call returns.
    os._exit in a reward ends the whole process here.
  * "auto" (the default): "process" when every function can be loaded in a worker process,
    else "thread" with a warning saying why. The default is the robust mode whenever it can
    be, and it can for what config names: a function registered when its module is imported,
    or a `package.module:function` path, loads in a worker by importing that module.

How worker processes start: a fresh interpreter (fork+exec via `subprocess`) that imports
only the standard library and `baton.rewards.serve`, gets this process's `sys.path`, and
unpickles the functions by reference - importing their modules, which runs their
`register_reward` calls, so registered names resolve there too (a function registered
without a name of its own, like a module-level lambda, is looked up in the child's
`REWARD_FUNCTIONS` after its module is imported; a module not importable by name, like a
pytest test module, is loaded from its file). Not fork: this process has torch (OpenMP),
Ray and logging threads whose locks a forked child would inherit held, and replacements are
forked mid-run. Not multiprocessing's spawn or forkserver: both re-import the caller's
`__main__` (under `python -m baton.cli` that is torch and the trainer, in every worker;
inside a Ray actor, Ray's worker script), and forkserver is one process-wide server with a
global preload list. A worker starts in about 0.1 s, in the background from construction
on; the first `score()` waits for one.

A function's `prepare()` (an attribute, if it has one: e.g. an optional package's slow
import) runs once where the functions are loaded, a worker's start, never under a call's
deadline (`baton.rewards.serve.prepare`).

Workers end with the runner: `close()` (also run when the runner is collected, and at
interpreter exit) SIGKILLs worker processes without waiting on their calls; worker threads
are daemons. A worker process also exits when its parent does (PR_SET_PDEATHSIG where the
runner lives on the main thread, and a watchdog thread).
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable

from baton.rewards.pool import BUSY, DEAD, IDLE, STARTING, ProcessSlot, Slot, ThreadSlot, dump_functions, shutdown
from baton.rewards.registry import REWARD_FUNCTIONS, RewardFn, register_reward  # noqa: F401  (re-exported)
from baton.rewards.serve import ERROR, NONFINITE, OK, PENDING, prepare

SANDBOXES = ("auto", "process", "thread")
log = logging.getLogger(__name__)

TIMEOUT = 4.0  # a call's status when the runner gave up on it (the worker never writes it)
CHUNKS_PER_WORKER = 2  # chunks per worker per score(): fewer messages vs. balance
CHUNK_CAP = 256  # calls per chunk at most (the shared buffer holds this many)
START_TIMEOUT_S = 60.0  # a worker process that is not ready by then has failed to start
START_RETRIES = 3  # worker processes in a row that fail to start before score() raises
_KINDS = {ERROR: "errors", TIMEOUT: "timeouts", NONFINITE: "nonfinite"}


def resolve_reward(name: str) -> RewardFn:
    """A registered name, a Python callable `baton.train` registered (`python/...`), or
    `package.module:function`."""
    from baton.rewards.python import PYTHON_REWARDS

    if name in PYTHON_REWARDS:
        return PYTHON_REWARDS[name]
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    if ":" in name:
        from baton.user_modules import load_object  # a one-line error for a missing module

        module, _, attr = name.partition(":")
        fn = load_object(name, "reward function")
        if callable(fn):
            return fn
        raise ValueError(f"reward function {name!r}: {module} has no callable {attr!r}")
    if name.startswith("python/"):
        raise ValueError(f"reward function {name!r} was a Python callable given to baton.train in another "
                         f"process: run it from Python again (the same call, with trainer.resume=auto to continue)")
    raise ValueError(f"unknown reward function {name!r}; registered: {sorted(REWARD_FUNCTIONS)} "
                     f"(or give 'package.module:function')")


@dataclass
class RewardStats:
    """Failed calls per sample (a sample with two failing functions counts two); each
    scored 0. `errors`: raised, or its worker process died; `timeouts`: ran past the
    deadline; `nonfinite`: returned NaN, +-inf or something float() rejects."""
    errors: list[int]
    timeouts: list[int]
    nonfinite: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.nonfinite:
            self.nonfinite = [0] * len(self.errors)

    @classmethod
    def zeros(cls, n: int) -> "RewardStats":
        return cls([0] * n, [0] * n, [0] * n)

    def columns(self) -> dict[str, list[int]]:
        """Every count by name: {"errors": [...], "timeouts": [...], "nonfinite": [...]}."""
        return {"errors": self.errors, "timeouts": self.timeouts, "nonfinite": self.nonfinite}


class _SwitchToThreads(Exception):
    pass


class RewardRunner:
    """Scores completions with weighted reward functions; see the module docstring.

    functions: name (registered, or `package.module:function`) -> weight.
    timeout_s: deadline of each call, from its start (None or <= 0: none).
    max_workers: worker processes (or threads) running calls at once.
    sandbox: "auto" (default), "process" or "thread".
    callables: functions given as objects, by the name `functions` weights (not resolved by
        name; e.g. evaluation's `baton.envs.evaluate.Verdict`, pickled by value for a worker).
    """

    def __init__(self, functions: dict[str, float], timeout_s: float | None = 5.0, max_workers: int = 4,
                 sandbox: str = "auto", callables: dict[str, RewardFn] | None = None):
        if not functions:
            raise ValueError("at least one reward function is needed")
        if sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {SANDBOXES}, got {sandbox!r}")
        given = callables or {}
        self.fns = {name: (given[name] if name in given else resolve_reward(name), float(w))
                    for name, w in functions.items()}
        self.names = list(self.fns)
        self.timeout_s = float(timeout_s) if timeout_s and timeout_s > 0 else math.inf
        self.max_workers = max(1, int(max_workers))
        self._fn_list = [fn for fn, _ in self.fns.values()]
        self._auto = sandbox == "auto"
        self._verified = False  # a worker process has loaded the functions once
        self._start_failures = 0
        self._graveyard: list[ProcessSlot] = []  # killed, not yet reaped
        self._lock = threading.Lock()
        self._zeros = memoryview(bytes(8 * CHUNK_CAP)).cast("d")
        self._slots: list[Slot] = []  # shared with the finalizer; it must not hold self
        self._finalizer = weakref.finalize(self, shutdown, self._slots)
        self.sandbox = "thread" if sandbox == "thread" else self._check_process(sandbox)
        if self.sandbox == "thread":
            prepare(self._fn_list)  # a process worker runs it as it loads them (serve.load_functions)
        self._fill()

    def _check_process(self, sandbox: str) -> str:
        why = None
        if os.name != "posix":
            why = "worker processes need a POSIX system"
        else:
            try:
                self._init = dump_functions([(n, fn) for n, (fn, _) in self.fns.items()], REWARD_FUNCTIONS)
            except Exception as e:
                why = f"{type(e).__name__}: {e}"
        if why is None:
            return "process"
        if sandbox == "process":
            raise ValueError(f"reward functions {self.names} cannot run in worker processes ({why}); "
                             f"define them at the top level of an importable module, or use sandbox='thread'")
        from baton.rewards.python import PythonReward

        # a callable given to baton.train from a script or notebook: threads are its expected home
        given = any(isinstance(fn, PythonReward) for fn in self._fn_list)
        log.log(logging.INFO if given else logging.WARNING, "reward functions %s run in threads of this process, "
                "not in worker processes (%s): a hung call cannot be stopped there", self.names, why)
        return "thread"

    # ---- workers ----------------------------------------------------------------------

    def _new_slot(self) -> Slot:
        slot: Slot = ProcessSlot(self._init, CHUNK_CAP) if self.sandbox == "process" \
            else ThreadSlot(self._fn_list, CHUNK_CAP)
        self._slots.append(slot)
        if not self._finalizer.alive:  # close() ran meanwhile (from another thread)
            slot.kill()
            raise RuntimeError("RewardRunner closed while scoring")
        return slot

    def _fill(self) -> None:
        """Drop dead slots and open new ones up to max_workers."""
        for s in [s for s in self._slots if s.state == DEAD]:
            self._slots.remove(s)
            if isinstance(s, ProcessSlot):
                self._graveyard.append(s)
        self._graveyard = [s for s in self._graveyard if not s.reap()]
        while len(self._slots) < self.max_workers:
            self._new_slot()

    def close(self) -> None:
        """Kill the workers (SIGKILL, no waiting on their calls). Idempotent; the runner is
        unusable afterwards. Also runs when the runner is collected and at interpreter exit."""
        self._finalizer()

    def __enter__(self) -> "RewardRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- scoring ----------------------------------------------------------------------

    def score(self, prompts: list[str], completions: list[str], rows: list[dict[str, Any]]
              ) -> tuple[list[float], dict[str, list[float]], RewardStats]:
        """Weighted total per sample, the per-function scores, and failure counts.
        A failed call (see RewardStats) scores 0; every returned score is finite."""
        n = len(prompts)
        if len(completions) != n or len(rows) != n:
            raise ValueError(f"score(): {n} prompts, {len(completions)} completions, {len(rows)} rows")
        with self._lock:
            if not self._finalizer.alive:
                raise RuntimeError("RewardRunner.score() after close()")
            data = list(zip(prompts, completions, rows))
            try:
                values, codes, notes = self._run(data)
            except _SwitchToThreads:
                values, codes, notes = self._run(data)
        nf = len(self.names)
        stats = RewardStats.zeros(n)
        per_fn: dict[str, list[float]] = {name: [0.0] * n for name in self.names}
        counts = {kind: 0 for kind in _KINDS}
        for c, code in enumerate(codes):
            r, f = divmod(c, nf)
            if code == OK:
                per_fn[self.names[f]][r] = values[c]
            else:
                kind = code if code in _KINDS else ERROR
                getattr(stats, _KINDS[kind])[r] += 1
                counts[kind] += 1
        for kind, count in counts.items():
            if count:
                c, text = notes.get(kind, (None, None))
                name = self.names[c % nf] if c is not None else "?"
                log.warning("reward function %r %s; scored 0 (%s: %d of the %d calls of this batch)",
                            name, text or "failed (its message was lost with its worker)",
                            _KINDS[kind], count, len(codes))
        totals = [sum(w * per_fn[name][i] for name, (_, w) in self.fns.items()) for i in range(n)]
        return totals, per_fn, stats

    def _run(self, data: list[tuple[str, str, dict]]) -> tuple[list[float], list[float], dict]:
        """Run every (row, function) call; call c is row c // nf, function c % nf."""
        nf = len(self.names)
        n_calls = len(data) * nf
        values, codes = [0.0] * n_calls, [PENDING] * n_calls
        notes: dict[float, tuple[int, str]] = {}  # kind -> (call, message): the first of each
        size = max(1, min(CHUNK_CAP, -(-n_calls // (self.max_workers * CHUNKS_PER_WORKER))))
        todo = deque(list(range(s, min(s + size, n_calls))) for s in range(0, n_calls, size))
        left = n_calls
        timeout = self.timeout_s

        def note(kind: float, call: int, text: str) -> None:
            if kind not in notes or call < notes[kind][0]:  # the first in batch order
                notes[kind] = (call, text)

        def finish(slot: Slot, blame: int | None, kind: float, text: str) -> None:
            """Take what the slot's chunk got done; `blame` (a position) fails with `kind`;
            calls not done go back on the queue."""
            nonlocal left
            vals, sts = slot.read()
            again = []
            for j, c in enumerate(slot.chunk):
                if j == blame:
                    codes[c] = kind
                    note(kind, c, text)
                elif sts[j] != PENDING:
                    codes[c], values[c] = sts[j], vals[j]
                else:
                    again.append(c)
            left -= len(slot.chunk) - len(again)
            if again:
                todo.appendleft(again)

        def lost(slot: Slot, blame: int | None, kind: float, text: str) -> None:
            finish(slot, blame, kind, text)
            slot.kill()
            self._fill()

        ok = False
        try:
            while left:
                if not self._finalizer.alive:
                    raise RuntimeError("RewardRunner closed while scoring")
                now = time.monotonic()
                for slot in self._slots:
                    if slot.state == IDLE and todo:
                        chunk = todo.popleft()
                        try:
                            payload = self._pack(chunk, data, nf)
                        except Exception as e:  # a row that cannot be pickled: its calls fail
                            for c in chunk:
                                codes[c] = ERROR
                                note(ERROR, c, f"could not be sent its row ({type(e).__name__}: {e})")
                            left -= len(chunk)
                            continue
                        try:
                            slot.dispatch(chunk, payload, self._zeros)
                        except (OSError, ValueError):  # the worker is gone; blame no call
                            todo.appendleft(chunk)
                            slot.kill()
                if any(s.state == DEAD for s in self._slots):
                    self._fill()
                    continue
                # Sleep until a message arrives or the earliest deadline.
                wake = now + 5.0
                for slot in self._slots:
                    if slot.state == BUSY:
                        wake = min(wake, self._deadline(slot, now, timeout))
                    elif slot.state == STARTING:
                        wake = min(wake, slot.started + START_TIMEOUT_S)
                live = {s.conn: s for s in self._slots if s.state in (BUSY, STARTING)}
                if not live:
                    raise RuntimeError("reward runner: no worker to run calls on")  # not reached
                try:
                    ready = wait(list(live), max(0.0, wake - time.monotonic()))
                except OSError:  # a pipe closed under us: close() from another thread
                    continue
                for conn in ready:
                    slot = live[conn]
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError, pickle.UnpicklingError):
                        self._died(slot, lost)
                        continue
                    if slot.state == STARTING:
                        self._started(slot, msg)
                    else:  # a chunk is done
                        finish(slot, None, ERROR, "")
                        for kind, (j, text) in msg.items():
                            note(kind, slot.chunk[j], text)
                        slot.state = IDLE
                now = time.monotonic()
                for slot in self._slots:
                    if slot.state == BUSY and now >= self._deadline(slot, now, timeout):
                        j = slot.scan
                        what = ("its worker process was killed and replaced" if slot.kind == "process"
                                else "its thread was abandoned")
                        if j < len(slot.chunk):
                            lost(slot, j, TIMEOUT, f"ran past its {timeout:g}s deadline; {what}")
                        else:  # every call done but no word from the worker: drop it
                            lost(slot, None, ERROR, "")
                    elif slot.state == STARTING and now >= slot.started + START_TIMEOUT_S:
                        slot.kill()
                        self._start_failed(f"not ready after {START_TIMEOUT_S:g}s")
            ok = True
        finally:
            if not ok:  # interrupted: workers still busy with this call's chunks are dropped
                for slot in self._slots:
                    if slot.state == BUSY:
                        slot.kill()
        self._fill()
        return values, codes, notes

    def _pack(self, chunk: list[int], data: list, nf: int) -> bytes:
        index: dict[int, int] = {}
        rows, calls = [], []
        for c in chunk:
            r, f = divmod(c, nf)
            if r not in index:
                index[r] = len(rows)
                rows.append(data[r])
            calls.append((index[r], f))
        return pickle.dumps((calls, rows), protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def _deadline(slot: Slot, now: float, timeout: float) -> float:
        """When the slot's running call is due; advances what the runner has seen done."""
        buf, cap, k = slot.buf, slot.cap, len(slot.chunk)
        j = slot.scan
        while j < k and buf[2 * cap + j] != PENDING:
            j += 1
        if j != slot.scan:
            slot.scan, slot.seen = j, now
        start = buf[j] if j < k else 0.0
        # Not started yet (between calls, or the chunk is still arriving): count from when
        # progress was last seen, so a worker stuck outside a call is caught too.
        return (start if start > 0 else slot.seen) + timeout

    def _started(self, slot: Slot, msg: Any) -> None:
        kind, detail = msg
        if kind == "ready":
            slot.state, self._verified, self._start_failures = IDLE, True, 0
            return
        slot.kill()
        if self._auto and not self._verified:
            log.warning("reward functions %s cannot be loaded in a worker process; running them in "
                        "threads of this process instead (a hung call cannot be stopped there):\n%s",
                        self.names, detail)
            shutdown(self._slots)
            self.sandbox = "thread"
            self._fill()
            raise _SwitchToThreads()
        raise RuntimeError(f"a reward worker process could not load the reward functions {self.names} "
                           f"(define them at the top level of an importable module, or use "
                           f"sandbox='thread'):\n{detail}")

    def _died(self, slot: Slot, lost: Callable[..., None]) -> None:
        # close() from another thread closes the pipes and marks every slot DEAD (after it
        # marks the runner closed): read the state first, then check for close, so a slot
        # still starting (no chunk sent) is never taken for one that was running calls.
        state = slot.state
        if not self._finalizer.alive:
            raise RuntimeError("RewardRunner closed while scoring")
        why = slot.exit_status(0.5) if isinstance(slot, ProcessSlot) else "its worker thread ended"
        if state == STARTING:
            slot.kill()
            self._start_failed(why)
            return
        # The call it was running is the one to blame (the first not done; if it died
        # between calls, that one too: every death then takes a call, so this ends).
        blame = slot.scan
        vals, sts = slot.read()
        while blame < len(sts) and sts[blame] != PENDING:
            blame += 1
        lost(slot, blame if blame < len(sts) else None, ERROR, f"failed: {why}")

    def _start_failed(self, why: str) -> None:
        self._start_failures += 1
        if self._start_failures >= START_RETRIES:
            raise RuntimeError(f"reward worker processes fail to start ({self._start_failures} in a row; "
                               f"last: {why}); see stderr above, or use sandbox='thread'")
        self._fill()
