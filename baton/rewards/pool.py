"""The runner's workers: reward worker processes (killable) and in-process threads.

A slot is one worker plus the pipe to it and the shared progress buffer `serve` writes
(layout in `baton.rewards.serve`). The runner (`baton.rewards.runner`) schedules chunks
onto slots and, when a call runs past its deadline or a worker dies, kills the slot and
opens a fresh one in its place.

* `ProcessSlot`: a fresh Python interpreter running `baton.rewards.serve.main`, started
  with `subprocess` (a fork+exec, which is safe in a process full of torch threads) and
  given the parent's `sys.path`. The progress buffer is a shared memory file (memfd) both
  map. It runs in a process group of its own; `kill()` is SIGKILL to that group: it stops
  any call, whatever it is doing, subprocesses the call started included, and never waits.
* `ThreadSlot`: a daemon thread of this process running the same loop. `kill()` can only
  abandon the thread (Python cannot stop one): it keeps its stuck call and exits when that
  returns, but it never blocks the process from exiting.

`dump_functions` pickles the reward functions by reference for the worker processes (or,
for one registered at import without a name of its own, by its registered name), and fails
(so the runner can say why, or fall back to threads) for those a fresh interpreter cannot
load: closures, functions defined in `__main__`.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from multiprocessing.connection import Connection, Pipe
from typing import Any, Callable

from baton.rewards.serve import ITEM_BYTES, serve

STARTING, IDLE, BUSY, DEAD = "starting", "idle", "busy", "dead"


class _RefPickler(pickle.Pickler):
    """Pickles by reference, refusing what lives in `__main__` (a worker process does not
    run the caller's script), and records the modules it refers to."""

    def __init__(self, file: io.BytesIO):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            module = getattr(obj, "__module__", None)
            if module == "__main__":
                name = getattr(obj, "__qualname__", obj)
                raise pickle.PicklingError(f"{name!r} is defined in __main__, which a worker process does not run")
            if module:
                self.modules.add(module)
        return NotImplemented


def dump_functions(named: list[tuple[str, Callable[..., Any]]], registry: dict[str, Any]) -> bytes:
    """What a worker process needs to load the functions: for each, its pickle or, for a
    function registered when its module is imported but not reachable by its own name (a
    module-level `register_reward("x")(lambda ...)`), ("registered", name, module); and the
    file of each module referred to (for modules the worker cannot import by name).
    Raises (pickle.PicklingError, TypeError, ...) for a function a worker cannot load."""
    specs: list[Any] = []
    modules: set[str] = set()
    for name, fn in named:
        buf = io.BytesIO()
        pickler = _RefPickler(buf)
        try:
            pickler.dump(fn)
        except Exception as e:
            module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "<locals>")
            if registry.get(name) is not fn or module in (None, "__main__") or "<locals>" in qualname:
                raise type(e)(f"{name!r}: {e}") from e
            specs.append(("registered", name, module))
            modules.add(module)
        else:
            specs.append(buf.getvalue())
            modules |= pickler.modules
    files = {m: f for m in sorted(modules)
             if isinstance(f := getattr(sys.modules.get(m), "__file__", None), str)}
    return pickle.dumps((specs, files), protocol=pickle.HIGHEST_PROTOCOL)


class Slot:
    kind = ""
    conn: Connection
    buf: memoryview
    cap: int
    state: str
    chunk: list[int]  # the call indices being run, while BUSY
    scan = 0  # calls of the chunk seen finished
    seen = 0.0  # when progress was last seen (or the chunk was sent)
    started = 0.0  # when the slot was opened

    def dispatch(self, chunk: list[int], data: bytes, zeros: memoryview) -> None:
        """Send a chunk (`data`, its pickle). Raises OSError/ValueError if the worker is gone."""
        k, cap = len(chunk), self.cap
        self.buf[0:k] = zeros[:k]  # cleared here, before the worker can write: no stale starts
        self.buf[2 * cap:2 * cap + k] = zeros[:k]
        self.conn.send_bytes(data)
        self.chunk, self.scan, self.seen, self.state = chunk, 0, time.monotonic(), BUSY

    def read(self) -> tuple[list[float], list[float]]:
        """(values, statuses) of the current chunk's calls."""
        k, cap = len(self.chunk), self.cap
        return self.buf[cap:cap + k].tolist(), self.buf[2 * cap:2 * cap + k].tolist()

    def kill(self) -> None:
        raise NotImplementedError

    def _close_conn(self) -> None:
        self.state = DEAD
        try:
            self.conn.close()
        except OSError:
            pass


class ThreadSlot(Slot):
    kind = "thread"

    def __init__(self, fns: list[Callable[..., Any]], cap: int):
        self.cap, self.state, self.started = cap, IDLE, time.monotonic()
        self.buf = memoryview(bytearray(cap * ITEM_BYTES)).cast("d")
        self.conn, theirs = Pipe()
        self.thread = threading.Thread(target=self._run, args=(theirs, fns), daemon=True,
                                       name="reward-call")
        self.thread.start()

    def _run(self, conn: Connection, fns: list[Callable[..., Any]]) -> None:
        try:
            serve(conn, self.buf, fns, self.cap)
        finally:
            conn.close()

    def kill(self) -> None:
        """Abandon the thread: it ends when its call returns (its results go nowhere)."""
        self._close_conn()


class ProcessSlot(Slot):
    kind = "process"

    def __init__(self, init: bytes, cap: int):
        self.cap, self.state, self.started = cap, STARTING, time.monotonic()
        self.pid: int | None = None
        size = cap * ITEM_BYTES
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("baton-reward")
        else:  # another POSIX: an unlinked temporary file
            fd = os.dup(tempfile.TemporaryFile().fileno())
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
            self.buf = memoryview(self._mm).cast("d")
            self.conn, theirs = Pipe()
            try:
                # The child gets SIGKILL when the thread that starts it ends; only ask for
                # that when it is the main thread, which ends with the process.
                deathsig = threading.current_thread() is threading.main_thread()
                code = (f"import sys; sys.path[:] = {sys.path!r}; from baton.rewards.serve import main; "
                        f"main({theirs.fileno()}, {fd}, {cap}, {os.getpid()}, {deathsig})")
                # a process group of its own: kill() takes whatever the reward function started too
                self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                             pass_fds=(theirs.fileno(), fd), start_new_session=True)
            finally:
                theirs.close()
        finally:
            os.close(fd)
        try:
            self.conn.send_bytes(init)
        except OSError:  # it died already: the runner sees EOF and counts a failed start
            pass

    def kill(self) -> None:
        """SIGKILL to the worker's process group (its subprocesses too), no waiting (the
        process is reaped later by `reap`)."""
        self._close_conn()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # start_new_session: the group id is its pid
        except OSError:
            pass
        try:
            self.proc.kill()
        except OSError:
            pass

    def exit_status(self, wait_s: float) -> str:
        """How the (dead or dying) worker ended, waiting at most `wait_s` to find out."""
        try:
            rc = self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return "its worker process closed its pipe"
        if rc < 0:
            try:
                return f"its worker process was killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"its worker process was killed by signal {-rc}"
        return f"its worker process exited with code {rc}"

    def reap(self) -> bool:
        """True once the process has ended (reaped, its buffer unmapped)."""
        if self.proc.poll() is None:
            return False
        try:
            self.buf.release()
            self._mm.close()
        except (BufferError, ValueError):
            pass
        return True


def shutdown(slots: list[Slot], reap_s: float = 0.5) -> None:
    """Kill every slot; wait at most `reap_s` in all to reap the SIGKILLed processes."""
    for s in slots:
        s.kill()
    end = time.monotonic() + reap_s
    for s in slots:
        if isinstance(s, ProcessSlot):
            try:
                s.proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    slots.clear()
