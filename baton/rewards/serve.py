"""The reward-call loop a worker serves, and the entry point of a reward worker process.

`serve` runs chunks of reward calls, one after the other, and writes each call's progress
into a small shared buffer the runner reads (see `baton.rewards.pool`):

    buf[j]           start time of call j (time.monotonic(); 0 until it starts)
    buf[cap + j]     its value (0.0 unless it succeeded)
    buf[2*cap + j]   its status: PENDING, OK, ERROR or NONFINITE

so the runner knows, without the worker's cooperation, which call of a chunk is running
and since when - a worker stuck in a call (even one holding the GIL, e.g. a regex that
backtracks forever) can be killed and the call blamed exactly. After a chunk the worker
sends one message, the first error and non-finite note of the chunk, for the log.

The same loop runs in a worker process (`main`, started by the runner as a fresh
interpreter) and, in the in-process mode, in a thread. This module imports only the
standard library, so a worker process starts in about the time Python itself takes.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import math
import mmap
import os
import pickle
import reprlib
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

PENDING, OK, ERROR, NONFINITE = 0.0, 1.0, 2.0, 3.0
ITEM_BYTES = 3 * 8  # start time, value, status: three doubles per call


def _describe(e: BaseException) -> str:
    try:
        text = str(e)
    except BaseException:  # a __str__ that raises
        text = ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def serve(conn: Any, buf: memoryview, fns: list[Callable[..., Any]], cap: int) -> None:
    """Run chunks received on `conn` until it closes. A chunk is the pickle of
    (calls, rows): calls [(row index, function index)], rows [(prompt, completion, fields)]."""
    clock, isfinite = time.monotonic, math.isfinite
    while True:
        try:
            calls, rows = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the runner closed the pipe: done
            return
        notes: dict[float, tuple[int, str]] = {}
        for j, (r, f) in enumerate(calls):
            prompt, completion, fields = rows[r]
            value, code = 0.0, OK
            buf[j] = clock()
            try:
                out = fns[f](prompt, completion, **fields)
            except BaseException as e:  # SystemExit, KeyboardInterrupt too: a sample's failure
                code = ERROR
                if ERROR not in notes:
                    notes[ERROR] = (j, f"raised {_describe(e)}")
            else:
                try:
                    value = float(out)
                    bad = not isfinite(value)
                except BaseException as e:
                    bad, why = True, f" ({_describe(e)})"
                else:
                    why = ""
                if bad:
                    value, code = 0.0, NONFINITE
                    if NONFINITE not in notes:
                        try:
                            shown = reprlib.repr(out)
                        except BaseException:
                            shown = f"a {type(out).__name__}"
                        notes[NONFINITE] = (j, f"returned {shown}{why}, not a finite number")
            buf[cap + j] = value
            buf[2 * cap + j] = code
        try:
            conn.send(notes)
        except (OSError, ValueError):  # the runner gave up on this worker
            return


class _Unpickler(pickle.Unpickler):
    """Loads the reward functions by reference (module + name), importing their modules -
    which also runs their `register_reward` decorators. A module that is not importable by
    name here (e.g. a pytest module imported with --import-mode=importlib) is loaded from
    the file the runner's process loaded it from."""

    def __init__(self, data: bytes, files: dict[str, str]):
        super().__init__(io.BytesIO(data))
        self.files = files

    def find_class(self, module: str, name: str) -> Any:
        obj: Any = _import(module, self.files)
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj


def _import(module: str, files: dict[str, str]) -> Any:
    if module in sys.modules:
        return sys.modules[module]
    try:
        return importlib.import_module(module)
    except ImportError:
        if module not in files:
            raise
    spec = importlib.util.spec_from_file_location(module, files[module])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {module} from {files[module]}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[module]
        raise
    return mod


def load_functions(specs: list[Any], files: dict[str, str]) -> list[Callable[..., Any]]:
    """The functions `baton.rewards.pool.dump_functions` described."""
    fns = []
    for spec in specs:
        if isinstance(spec, bytes):
            fns.append(_Unpickler(spec, files).load())
            continue
        _, name, module = spec  # ("registered", name, module): importing it registers name
        _import(module, files)
        from baton.rewards.registry import REWARD_FUNCTIONS
        if name not in REWARD_FUNCTIONS:
            raise LookupError(f"importing {module} did not register reward function {name!r} "
                              f"(registered at run time, not at import?)")
        fns.append(REWARD_FUNCTIONS[name])
    prepare(fns)
    return fns


def prepare(fns: list[Callable[..., Any]]) -> None:
    """Run each function's `prepare()` (an attribute, if it has one) once, where the functions
    are loaded: in a worker before it says ready (within the worker's start budget), never
    under a call's deadline. For what every call needs and is slow to get the first time,
    e.g. an optional package's import (verifiers takes seconds: its first call would run past
    a 5 s deadline in every fresh worker, each replacement too)."""
    for fn in fns:
        ready = getattr(fn, "prepare", None)
        if callable(ready):
            ready()


def _exit(code: int) -> None:
    """Leave without joining threads a reward function may have started."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code)


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:  # the runner's process is gone
            _exit(1)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it ends (the runner passes
    `deathsig` only when that is the main thread, i.e. when its process ends). Unlike the
    watchdog thread this also works while a call holds the GIL."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def main(conn_fd: int, buf_fd: int, cap: int, ppid: int, deathsig: bool) -> None:
    """Entry point of a reward worker process (started by `baton.rewards.pool`)."""
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the runner's process
    if deathsig and sys.platform.startswith("linux"):
        _die_with_parent()
    if os.getppid() != ppid:
        _exit(1)
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True).start()
    conn = Connection(conn_fd)
    mm = mmap.mmap(buf_fd, cap * ITEM_BYTES)
    os.close(buf_fd)
    buf = memoryview(mm).cast("d")
    try:
        specs, files = pickle.loads(conn.recv_bytes())
        fns = load_functions(specs, files)
    except BaseException:
        try:
            conn.send(("load_error", traceback.format_exc()))
        finally:
            _exit(1)
    conn.send(("ready", os.getpid()))
    serve(conn, buf, fns, cap)
    _exit(0)
