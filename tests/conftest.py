"""Session-wide fixtures: one local Ray instance for every test that needs Ray.

Starting Ray costs seconds to tens of seconds on a loaded 2-core machine, so the suite starts
it once, at the first test that needs it, and stops it at the end of the session. A test
marked `ray` gets it without asking; a fixture that needs Ray (e.g. a module's worker group)
names `ray_cluster`. Tests must not shut it down (a trainer's teardown leaves it up: it calls
`shutdown_ray(only_ours=True)`, which stops only a Ray that its own pool started); one that
does anyway only costs the next Ray test a restart.
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
# The suite runs in one process per usable core, at most 4 (pytest-xdist, `-n auto` in
# pyproject.toml's addopts; `pytest_xdist_auto_num_workers` below): 2 on the 2-core machines it is
# made for. Each takes one torch thread, as two torch threads per process on two busy cores run
# far slower than one. Subprocesses the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
MAX_WORKERS = 4  # each worker that meets a `ray` test starts a Ray of its own (~1 GiB)


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
    return min(MAX_WORKERS, usable_cores())


def _start_ray() -> bool:
    """baton's settings (auth off, no usage stats, no dashboard, a temp dir of its own),
    8 CPUs. Ray workers get the driver's cwd and script dir on their path, not the test dirs
    that conftests add (e.g. tests/controller for `ctl_workers`, whose classes cloudpickle
    ships by reference): hand those over."""
    from baton.controller import ensure_ray

    test_dirs = [p for p in dict.fromkeys(sys.path) if p and Path(p).resolve().is_relative_to(TESTS)]
    return ensure_ray(num_cpus=8, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(test_dirs)}})


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
