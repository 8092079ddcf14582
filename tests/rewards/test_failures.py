"""Reward calls that hang, exit, crash or return garbage: each is counted for its sample and
scores 0, the other samples score normally, and the process still exits promptly.

`sandbox=None` runs the runner as the trainer does (no argument: the default, worker
processes for these module-level functions); "thread" is the in-process mode.
"""

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import importlib.util
import logging

import pytest

import baton.envs  # noqa: F401  (registers arithmetic/correct)
from baton.rewards.runner import REWARD_FUNCTIONS, RewardRunner, register_reward

HANG_S = 20  # long enough that only a per-call deadline gets past it


@register_reward("test/sleepy")
def _sleepy(prompt, completion, **row):
    if completion == "hang":
        time.sleep(HANG_S)
    return float(len(completion))


@register_reward("test/exits")
def _exits(prompt, completion, **row):
    if completion == "exit":
        sys.exit(3)
    if completion == "interrupt":
        raise KeyboardInterrupt
    return 1.0


@register_reward("test/dies")
def _dies(prompt, completion, **row):
    if completion == "exit":
        os._exit(1)
    if completion == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0


_GARBAGE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "text": "abc", "none": None, "list": [1.0]}


@register_reward("test/garbage")
def _garbage(prompt, completion, **row):
    return _GARBAGE.get(completion, 1.0)


@register_reward("test/pid")
def _pid(prompt, completion, **row):
    return float(os.getpid())


def make(functions, sandbox, **kw):
    return RewardRunner(functions, **kw, **({} if sandbox is None else {"sandbox": sandbox}))


@pytest.mark.parametrize("sandbox", [None, "thread"])
def test_hung_calls_time_out_alone(sandbox):
    """4 hung samples of 32, 2 s deadline: exactly those 4 time out, all others score.
    (2 s, not less: on a loaded 2-core machine a healthy call can wait ~1 s for a core.)"""
    completions = ["hang" if i % 8 == 5 else "x" * (1 + i % 4) for i in range(32)]
    runner = make({"test/sleepy": 1.0}, sandbox, timeout_s=2.0, max_workers=4)
    assert runner.score(["p"], ["ok"], [{}])[0] == [2.0]  # workers up
    start = time.perf_counter()
    totals, per_fn, stats = runner.score(["p"] * 32, completions, [{}] * 32)
    elapsed = time.perf_counter() - start
    assert stats.timeouts == [int(c == "hang") for c in completions]
    assert stats.errors == [0] * 32 and stats.nonfinite == [0] * 32
    assert totals == per_fn["test/sleepy"] == [0.0 if c == "hang" else float(len(c)) for c in completions]
    assert elapsed < 4 * HANG_S, elapsed  # not waiting for the hangs (a loaded machine took 36 s)
    assert runner.score(["p"] * 3, ["a", "bb", "ccc"], [{}] * 3)[0] == [1.0, 2.0, 3.0]
    runner.close()


@pytest.mark.parametrize("sandbox", [None, "thread"])
def test_sys_exit_and_keyboard_interrupt_are_counted_errors(sandbox, caplog):
    runner = make({"test/exits": 1.0}, sandbox, max_workers=2)
    completions = ["ok", "exit", "ok", "interrupt", "ok"]
    with caplog.at_level(logging.WARNING, logger="baton.rewards.runner"):
        totals, _, stats = runner.score(["p"] * 5, completions, [{}] * 5)
    assert totals == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert stats.errors == [0, 1, 0, 1, 0] and stats.timeouts == [0] * 5
    assert "raised SystemExit: 3" in caplog.text  # the first error's message is logged
    assert runner.score(["p"] * 2, ["ok", "ok"], [{}] * 2)[0] == [1.0, 1.0]
    runner.close()


def test_a_worker_process_that_dies_is_a_counted_error_and_is_replaced():
    runner = RewardRunner({"test/dies": 1.0, "test/pid": 0.0}, max_workers=2)
    completions = ["ok", "exit", "ok", "kill", "ok", "ok"]
    totals, per_fn, stats = runner.score(["p"] * 6, completions, [{}] * 6)
    assert per_fn["test/dies"] == totals == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    assert stats.errors == [0, 1, 0, 1, 0, 0] and stats.timeouts == [0] * 6
    assert os.getpid() not in per_fn["test/pid"] and runner.sandbox == "process"
    # the pool recovers: two dead workers were replaced, everything scores again
    totals, _, stats = runner.score(["p"] * 8, ["ok"] * 8, [{}] * 8)
    assert totals == [1.0] * 8 and stats.errors == [0] * 8
    runner.close()


@pytest.mark.parametrize("sandbox", [None, "thread"])
def test_nonfinite_and_unconvertible_rewards_are_counted_and_score_zero(sandbox, caplog):
    runner = make({"test/garbage": 2.0}, sandbox, max_workers=2)
    completions = ["ok", "nan", "inf", "-inf", "text", "none", "list", "ok"]
    with caplog.at_level(logging.WARNING, logger="baton.rewards.runner"):
        totals, per_fn, stats = runner.score(["p"] * 8, completions, [{}] * 8)
    assert totals == [2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    assert per_fn["test/garbage"] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert stats.nonfinite == [0, 1, 1, 1, 1, 1, 1, 0]
    assert stats.errors == [0] * 8 and stats.timeouts == [0] * 8
    assert "not a finite number" in caplog.text
    assert stats.columns() == {"errors": stats.errors, "timeouts": stats.timeouts, "nonfinite": stats.nonfinite}
    runner.close()


EXIT_PROGRAM = """
import sys, time
sys.path.insert(0, {dir!r})
from baton.rewards.runner import RewardRunner
runner = RewardRunner({{"baton_test_hang:hang": 1.0}}, timeout_s=0.5, max_workers=2{kw})
totals, _, stats = runner.score(["p"] * 4, ["hang", "x", "hang", "x"], [{{}}] * 4)
print("scored", totals, stats.timeouts, time.time(), flush=True)
"""


@pytest.mark.parametrize("sandbox", [None, "thread"])
def test_a_program_with_a_hung_reward_exits_promptly(sandbox, tmp_path):
    (tmp_path / "baton_test_hang.py").write_text(textwrap.dedent("""
        import time
        def hang(prompt, completion, **row):
            if completion == "hang":
                time.sleep(600)
            return 1.0
        """))
    kw = "" if sandbox is None else f", sandbox={sandbox!r}"
    program = EXIT_PROGRAM.format(dir=str(tmp_path), kw=kw)
    # capture_output: run() also waits for every process holding the program's stdout, so
    # a worker process left running would fail this too.
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    ended = time.time()
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("scored")][0]
    assert line.startswith("scored [0.0, 1.0, 0.0, 1.0] [1, 0, 1, 0] ")
    assert ended - float(line.split()[-1]) < 5.0  # not the 600 s the hung calls would take


def test_registered_names_and_import_paths_resolve_in_worker_processes(tmp_path, monkeypatch):
    (tmp_path / "baton_test_paths.py").write_text("import os\n\ndef pid(prompt, completion, **row):\n"
                                                   "    return float(os.getpid())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # A module importable only from its file (as pytest's importlib mode loads test modules).
    by_file = tmp_path / "elsewhere" / "baton_test_by_file.py"
    by_file.parent.mkdir()
    by_file.write_text("import os\nfrom baton.rewards.runner import register_reward\n\n"
                       "@register_reward('test/by_file')\ndef pid(prompt, completion, **row):\n"
                       "    return float(os.getpid()) + 0.5\n\n"
                       "register_reward('test/lambda')(lambda prompt, completion, **row: float(os.getpid()))\n")
    spec = importlib.util.spec_from_file_location("baton_test_by_file", by_file)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "baton_test_by_file", module)
    spec.loader.exec_module(module)
    try:
        names = ["test/pid", "baton_test_paths:pid", "test/by_file", "test/lambda", "arithmetic/correct"]
        runner = RewardRunner({n: 1.0 for n in names}, max_workers=2)
        _, per_fn, stats = runner.score(["1+1="] * 3, ["2", "3", "2"], [{"answer": "2"}] * 3)
        assert stats.errors == [0] * 3
        assert per_fn["arithmetic/correct"] == [1.0, 0.0, 1.0]
        pids = (per_fn["test/pid"] + per_fn["baton_test_paths:pid"] + per_fn["test/lambda"]
                + [p - 0.5 for p in per_fn["test/by_file"]])
        assert all(p > 0 and p != os.getpid() for p in pids), pids  # ran in worker processes
        assert runner.sandbox == "process"
        runner.close()
    finally:
        REWARD_FUNCTIONS.pop("test/by_file", None)
        REWARD_FUNCTIONS.pop("test/lambda", None)


def test_functions_a_worker_process_cannot_import_run_in_threads(caplog):
    def local(prompt, completion, **row):  # a closure: no name a fresh interpreter can import
        return 3.0
    register_reward("test/local")(local)
    try:
        with pytest.raises(ValueError, match="sandbox='thread'"):
            RewardRunner({"test/local": 1.0}, sandbox="process")
        with caplog.at_level(logging.WARNING, logger="baton.rewards.runner"):
            runner = RewardRunner({"test/local": 1.0, "test/pid": 0.0})
        assert runner.sandbox == "thread" and "run in threads" in caplog.text
        _, per_fn, _ = runner.score(["p"], ["c"], [{}])
        assert per_fn == {"test/local": [3.0], "test/pid": [float(os.getpid())]}
        runner.close()
    finally:
        REWARD_FUNCTIONS.pop("test/local", None)


def test_close_kills_a_call_in_flight_without_waiting_for_it():
    runner = RewardRunner({"test/sleepy": 1.0}, timeout_s=60, max_workers=2)
    runner.score(["p"], ["x"], [{}])  # workers up
    outcome = []

    def score():
        try:
            outcome.append(runner.score(["p"] * 2, ["hang", "x"], [{}] * 2))
        except RuntimeError as e:
            outcome.append(e)

    scoring = threading.Thread(target=score)
    scoring.start()
    time.sleep(1.0)  # the hung call is running
    start = time.perf_counter()
    runner.close()
    scoring.join(timeout=15)
    assert time.perf_counter() - start < 10.0 and not scoring.is_alive()  # the hang is 20 s
    assert isinstance(outcome[0], RuntimeError) and "closed while scoring" in str(outcome[0])


def test_close_while_a_worker_is_still_starting_raises_closed_while_scoring(monkeypatch):
    """The race a loaded machine hit: close() from another thread lands after the runner's
    `wait` saw a worker that had not started yet (no chunk ever sent to it) become readable
    and before it reads that worker's pipe. The interleaving is forced: the runner's first
    `wait` returns, then a second thread closes the runner and is joined, then the runner
    goes on. The scoring thread must raise "closed while scoring", not AttributeError."""
    import baton.rewards.runner as runner_module

    real_wait, runner, closed = runner_module.wait, None, []

    def wait_then_close(conns, timeout=None):
        ready = real_wait(conns, timeout)
        if ready and not closed:  # a worker is ready (still STARTING to the runner)
            closer = threading.Thread(target=runner.close)
            closer.start()
            closer.join()
            closed.append(True)
        return ready

    monkeypatch.setattr(runner_module, "wait", wait_then_close)
    runner = RewardRunner({"test/sleepy": 1.0}, timeout_s=60, max_workers=2)
    outcome = []

    def score():
        try:
            outcome.append(runner.score(["p"] * 2, ["x", "y"], [{}] * 2))
        except Exception as e:  # what the thread raised, whatever it is
            outcome.append(e)

    scoring = threading.Thread(target=score)
    scoring.start()
    scoring.join(timeout=60)
    assert closed and not scoring.is_alive()
    assert isinstance(outcome[0], RuntimeError) and "closed while scoring" in str(outcome[0]), outcome


def test_close_is_prompt_and_final():
    runner = RewardRunner({"test/sleepy": 1.0}, timeout_s=0.5, max_workers=2)
    with runner:
        _, _, stats = runner.score(["p"] * 2, ["hang", "x"], [{}] * 2)
        assert stats.timeouts == [1, 0]
        start = time.perf_counter()
    assert time.perf_counter() - start < 2.0
    with pytest.raises(RuntimeError, match="after close"):
        runner.score(["p"], ["x"], [{}])
    runner.close()  # idempotent
