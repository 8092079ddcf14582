"""Session-wide fixtures: one Ray instance for every test that needs Ray.

Starting Ray costs seconds to tens of seconds on a loaded 2-core machine, and its daemons
~10 s of CPU, so the suite starts one for the session:
  * under xdist (the default: a worker per core plus one), the controller starts a Ray head
    in the background when the session begins, whether or not the selection needs it
    (`ray start --head --block`, a temp dir of its own, no dashboard), while the workers
    collect; each worker joins it as a driver (a job of its own) at its first test that
    needs Ray; the controller stops it at the end (SIGTERM to that `ray start`, which stops
    the processes it started);
  * in one process (`-n 0`), the process starts Ray itself at the first test that needs it.
A test marked `ray` gets it without asking; a fixture that needs Ray (e.g. a module's worker
group) names `ray_cluster`. Tests must not shut it down (a trainer's teardown leaves it up: it
calls `shutdown_ray(only_ours=True)`, which stops only a Ray that its own pool started); one
that does anyway only costs the next Ray test a reconnect. Subprocesses the tests start
(`baton train placement.backend=ray`) start Rays of their own, as a user's runs do.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# `baton train` of a PPO-family recipe chooses its placement from the machine unless told
# (placement.auto); the suite's runs, in-process and in subprocesses, are one process each,
# as measured: a test that wants auto sets placement.auto=true (tests/test_placement_auto_wiring.py).
os.environ.setdefault("BATON_PLACEMENT_AUTO", "0")
# The suite runs in one process per usable core plus one, at most 4 (pytest-xdist, `-n auto` in
# pyproject.toml's addopts; `pytest_xdist_auto_num_workers` below): 3 on the 2-core machines it is
# made for. Two workers left the cores 16% idle (tests waiting on timers they set, subprocess
# and Ray worker start-ups, HTTP); a third fills that: 308 -> 296 s, idle 16% -> 4% (BENCHMARKS.md).
# Each takes one torch thread, as two torch threads per process on two busy cores run far
# slower than one. Subprocesses the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
MAX_WORKERS = 4  # ~1.5 GiB each; they share the session's one Ray (pytest_configure)
# pytest caches each test module's rewritten code (and Python the modules' .pyc) as on a default
# Python install, whatever PYTHONDONTWRITEBYTECODE says (this project's machines set it): the
# workers' collection re-parsed every test file each run (~40% of its ~10 s). Subprocesses keep
# the environment's setting.
sys.dont_write_bytecode = False


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, less a cgroup quota (a container's
    `--cpus`, which affinity does not show)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def pytest_xdist_auto_num_workers(config):
    return min(MAX_WORKERS, usable_cores() + 1)


SHARED_RAY = "BATON_TEST_RAY_ADDRESS"  # the controller's Ray head (pytest_configure), for the workers
RAY_CPUS_PER_WORKER = 8


def _start_ray() -> bool:
    """baton's settings (auth off, no usage stats, no dashboard, a temp dir of its own),
    8 CPUs a worker. Ray workers get the driver's cwd and script dir on their path, not the
    test dirs that conftests add (e.g. tests/controller for `ctl_workers`, whose classes
    cloudpickle ships by reference): hand those over. Under xdist: join the session's head
    (baton's own path for an existing cluster, `RAY_ADDRESS`, docs/MULTINODE.md)."""
    import ray

    from baton.controller import ensure_ray

    test_dirs = [p for p in dict.fromkeys(sys.path) if p and Path(p).resolve().is_relative_to(TESTS)]
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(test_dirs)}}
    shared = os.environ.get(SHARED_RAY)
    if not shared:
        return ensure_ray(num_cpus=RAY_CPUS_PER_WORKER, runtime_env=runtime_env)
    if ray.is_initialized():
        return False
    _wait_for_port(shared, timeout_s=180)
    os.environ["RAY_ADDRESS"] = shared
    try:
        return ensure_ray(runtime_env=runtime_env)
    finally:
        del os.environ["RAY_ADDRESS"]  # the tests' subprocesses start Rays of their own


def _wait_for_port(address: str, timeout_s: float) -> None:
    import socket
    import time

    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the session's Ray head at {address} did not come up in {timeout_s:.0f} s "
                                   f"(its log: the controller's temp dir, ray-head.log)") from None
            time.sleep(0.2)


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's Ray instance (started on first use, stopped at the end of the session)."""
    _start_ray()
    yield
    from baton.controller import shutdown_ray

    shutdown_ray()


@pytest.fixture(autouse=True)
def _ray_for_ray_tests(request):
    if request.node.get_closest_marker("ray") is not None:
        request.getfixturevalue("ray_cluster")
        _start_ray()  # a no-op while it runs; restarts it if an earlier test shut it down


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need CUDA: skipped (with the reason) on a machine without it."""
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA (a gpu test: scripts/gpu_check.sh runs them on a GPU machine)")
        for item in gpu:
            item.add_marker(skip)


def pytest_configure(config):
    """In the controller, before the workers start: byte-compile baton, and start the session's
    Ray head when there are xdist workers (module docstring).

    Byte-compiling: with PYTHONDONTWRITEBYTECODE set (as on this project's machines) no process
    writes .pyc, so each of the suite's ~150 Python processes that import baton (xdist workers,
    Ray workers, `baton` subprocesses) compiled it again, ~0.25 s of CPU each. compileall
    writes them anyway (into the ignored __pycache__/)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import compileall

    compileall.compile_dir(str(TESTS.parent / "baton"), quiet=2)
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1 and getattr(config.option, "dist", "no") != "no":
        config.stash[_HEAD] = _start_ray_head(cpus=RAY_CPUS_PER_WORKER * workers)


_HEAD = pytest.StashKey[tuple]()


def _start_ray_head(cpus: int) -> tuple:
    """`ray start --head --block` in the background: (process, temp dir); its address in
    SHARED_RAY for the workers (which inherit the environment)."""
    import socket
    import subprocess
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="bt-ray-")  # short (Ray's socket paths are length-limited)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_worker_niceness": "0",  # as ensure_ray starts one (baton/controller/ray_backend.py)
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # Ray workers inherit it, as they did
    # from the xdist worker that started its own Ray (one torch thread a process, above)
    with open(os.path.join(temp, "ray-head.log"), "wb") as log:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
                                 f"--port={port}", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
                                 "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
                                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    os.environ[SHARED_RAY] = f"127.0.0.1:{port}"
    return proc, temp


def pytest_unconfigure(config):
    """Stop the session's Ray head: SIGTERM to its `ray start --block`, which stops what it
    started; SIGKILL to its process group if it has not in 60 s."""
    head = config.stash.get(_HEAD, None)
    if head is None:
        return
    import shutil
    import signal
    import subprocess

    proc, temp = head
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    os.environ.pop(SHARED_RAY, None)
    shutil.rmtree(temp, ignore_errors=True)
