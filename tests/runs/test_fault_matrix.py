"""The fault matrix: docs/RELIABILITY.md's guarantees for signals, a killed or stopped child
and a full disk, under each placement users run (issue 32; Ctrl-C: issue 30):

    in_process     placement.auto=false: one process (the test suite's default)
    one_step_off   trainer.mode=one_step_off: the actor in the driver, a generator process on Ray
    ray_dp         placement.backend=ray placement.world_size=2: the actor in two Ray ranks

Reduced forms (the default run): `baton.cli.main` in the test's own process on the session's
Ray, the shipped 0.82M warm start, a few steps; each fault is sent once the run shows it is
training (its step-1 metrics line), never after a sleep. Full forms (slow): `baton train` in
a process of its own that starts its own Ray, the signal sent to its whole process group (as
SLURM, a supervisor or a terminal's Ctrl-C send it), then a resume compared line for line
with an uninterrupted run. How Ray is started so that the driver keeps its signals:
`test_ray_starts_its_processes_apart_from_the_driver_s_signals` (default run, no Ray) and
`test_ray_leaves_the_driver_its_signals_and_its_process_group` (slow, a Ray of its own).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from faults import FullDiskActor
from runs_helpers import REPO, child_env

import baton.workers.actor as actor_module
from baton.cli import main
from baton.controller.ray_backend import STOPPED_GRACE_S, _proc_state
from baton.metrics import read_metrics
from baton.runs.checkpoints import is_complete
from baton.trainers import ppo

RECIPE = str(REPO / "recipes/grpo_arithmetic.yaml")
MODEL = str(REPO / "checkpoints/arith-sft")  # 0.82M parameters: its rewards vary, so the weights move
TINY = ["data.prompts_per_step=2", "data.eval_size=4", "rollout.n=4", "rollout.max_new_tokens=4",
        "actor.micro_batch_size=8", "actor.mini_batch_size=8", "actor.lr=1e-3", "trainer.progress=false",
        "placement.threads_per_worker=1", "reward.max_workers=1"]
PLACEMENTS = {
    "in_process": ["placement.auto=false"],
    "one_step_off": ["placement.auto=false", "trainer.mode=one_step_off"],
    "ray_dp": ["placement.auto=false", "placement.backend=ray", "placement.world_size=2"],
}
EVENT_S = 120.0  # how long a test waits for the run to reach the point of the fault: catches hangs only
DROP = ("timing/", "throughput/")


def argv(placement: str, run_dir: Path, *extra: str) -> list[str]:
    return ["train", RECIPE, f"model.path={MODEL}", f"trainer.run_dir={run_dir}", *TINY, *PLACEMENTS[placement],
            *extra]


def reached(run_dir: Path, step: int) -> bool:
    """Whether metrics.jsonl has the line of `step` (a torn last line is not one yet)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return False
    for line in reversed(lines):
        try:
            return json.loads(line)["step"] >= step
        except (ValueError, KeyError):
            continue
    return False


def when(ready, act) -> dict:
    """Call `act()` from a thread as soon as `ready()` holds (polled; up to EVENT_S);
    the returned dict gets "at" (time.monotonic()) when it did."""
    done: dict = {}

    def watch() -> None:
        deadline = time.monotonic() + EVENT_S
        while time.monotonic() < deadline:
            if ready():
                act()
                done["at"] = time.monotonic()
                return
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    return done


def one_line(err: str, start: str) -> str:
    """The single line of `err` that starts with `start`; no traceback anywhere."""
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith(start)]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def check_stopped_and_saved(run_dir: Path, line: str, name: str, steps: int) -> int:
    """The one line of a run stopped by signal `name`: the step it saved, and that checkpoint."""
    assert f"stopped by {name} after step " in line and "trainer.resume=auto" in line, line
    step = int(line.split("after step ")[1].split()[0])
    assert 1 <= step < steps and f"checkpoint step_{step} saved" in line, line
    assert is_complete(run_dir / "checkpoints" / f"step_{step}")
    assert [r["step"] for r in read_metrics(run_dir)][-1] == step  # the line of the saved step is the last
    return step


# --- signals ------------------------------------------------------------------------------
@pytest.mark.parametrize("placement, signame, code", [
    ("in_process", "SIGTERM", 143), ("in_process", "SIGINT", 130),
    pytest.param("one_step_off", "SIGTERM", 143, marks=pytest.mark.ray),
    pytest.param("ray_dp", "SIGTERM", 143, marks=[pytest.mark.ray, pytest.mark.slow]),
])  # SIGINT is the same handler; under the Ray placements, to the process group: the slow full forms
def test_a_signal_saves_the_step_in_progress(placement, signame, code, tmp_path, capsys):
    """SIGTERM (preemption) or Ctrl-C after step 1: the step in progress is finished and saved,
    one line names it and trainer.resume=auto, exit 143 / 130. (Before: Ctrl-C saved nothing
    with the default save_every=0; with a generator, SIGTERM was a C++ trace, exit 15, no
    checkpoint: that part needs a Ray the run starts itself: the slow full forms, and
    test_ray_starts_its_processes_apart_from_the_driver_s_signals.)"""
    run = tmp_path / "run"
    sig = getattr(signal, signame)
    when(lambda: reached(run, 1), lambda: os.kill(os.getpid(), sig))
    assert main(argv(placement, run, "trainer.steps=40")) == code
    name = "SIGINT (Ctrl-C)" if signame == "SIGINT" else signame
    check_stopped_and_saved(run, one_line(capsys.readouterr().err, "baton:"), name, 40)


# --- a full disk --------------------------------------------------------------------------
@pytest.mark.parametrize("placement", [
    "in_process", pytest.param("one_step_off", marks=[pytest.mark.ray, pytest.mark.slow]),  # its actor: the driver's
    pytest.param("ray_dp", marks=pytest.mark.ray),
])
def test_a_full_disk_at_checkpoint_time_is_one_line(placement, tmp_path, capsys, monkeypatch):
    """The second checkpoint finds the disk full (ENOSPC once its files are written), in the
    process that writes it (the driver; a Ray rank): one line naming ENOSPC and the path,
    exit 1, the first checkpoint intact, no temp dir left. (Before: 25 traceback frames of a
    WorkerError wrapping the DiskFullError, under every placement.)"""
    monkeypatch.setattr(actor_module, "ActorWorker", FullDiskActor)  # ROLES["actor"] names it by module:Class
    run = tmp_path / "run"
    assert main(argv(placement, run, "trainer.steps=2", "trainer.save_every=1")) == 1
    line = one_line(capsys.readouterr().err, "baton:")
    assert line.startswith("baton: error: ENOSPC") and str(run / "checkpoints" / "step_2") in line, line
    assert "previous checkpoint is kept" in line
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]
    assert is_complete(run / "checkpoints" / "step_1")


# --- a killed or stopped child ------------------------------------------------------------
CHILD = {"one_step_off": ("rollout", 0), "ray_dp": ("actor", 1)}  # the generator; a data-parallel rank


@pytest.mark.ray
@pytest.mark.parametrize("fault, placement", [
    # the default run: a stopped generator; a killed one (as a WorkerError) is tests/trainers/test_async.py's, a
    # killed or stopped rank tests/controller's; the one line of a died rank is the stopped one's code
    pytest.param("SIGKILL", "one_step_off", marks=pytest.mark.slow),
    pytest.param("SIGKILL", "ray_dp", marks=pytest.mark.slow),
    ("SIGSTOP", "one_step_off"),
    pytest.param("SIGSTOP", "ray_dp", marks=pytest.mark.slow),
])
def test_a_killed_or_stopped_child_is_one_line_within_seconds(fault, placement, tmp_path, capsys, monkeypatch):
    """SIGKILL or SIGSTOP of the generator (one_step_off) or of data-parallel rank 1 after step
    1: within seconds, one line naming the worker, its pid and what happened, and where the
    run continues from; exit 1, no hang. (Before: the WorkerError's traceback and Ray's text.)"""
    built: dict = {}
    real = ppo.build_roles

    def build_roles(*args, **kwargs):
        built.update(real(*args, **kwargs))
        return built

    monkeypatch.setattr(ppo, "build_roles", build_roles)
    role, rank = CHILD[placement]
    run = tmp_path / "run"
    pid: dict = {}

    def hit() -> None:
        pid["pid"] = built[role].pids[rank]
        os.kill(pid["pid"], getattr(signal, fault))

    sent = when(lambda: reached(run, 1), hit)
    try:
        assert main(argv(placement, run, "trainer.steps=40")) == 1
    finally:
        if "pid" in pid and _proc_state(pid["pid"]) in ("T", "t"):  # the run's teardown missed it: ours to end
            os.kill(pid["pid"], signal.SIGKILL)
    waited = time.monotonic() - sent["at"]
    bound = 10 + (STOPPED_GRACE_S if fault == "SIGSTOP" else 0)
    assert waited < bound, f"the run noticed its {fault}ed child after {waited:.1f} s"
    line = one_line(capsys.readouterr().err, "baton:")
    assert line.startswith("baton: error: ") and f"pid {pid['pid']}" in line, line
    assert ("died" if fault == "SIGKILL" else "is stopped") in line, line
    assert "trainer.resume=auto" in line and "no checkpoint yet" in line, line


# --- how Ray is started -------------------------------------------------------------------
RAY_START = textwrap.dedent("""
    import os, signal, sys, time
    got = []
    def handler(signum, frame):
        got.append(signum)
    signal.signal(signal.SIGTERM, handler)
    from baton.controller import ensure_ray, shutdown_ray
    import ray
    ensure_ray(num_cpus=1)
    assert signal.getsignal(signal.SIGTERM) is handler, signal.getsignal(signal.SIGTERM)
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the raylet had this long to go, had it got the signal too
    assert ray.get(ray.put(7), timeout=30) == 7 and all(n["Alive"] for n in ray.nodes())
    print("ok", got, flush=True)
    shutdown_ray()
""")


@pytest.mark.slow  # 10-30 s on 2 busy cores: a Ray of its own; its mechanism, at once: the next test
def test_ray_leaves_the_driver_its_signals_and_its_process_group(tmp_path):
    """A driver that handles SIGTERM starts Ray, and its process group gets SIGTERM (SLURM,
    `kill -TERM -PGID`): the driver's handler runs (ray.init had replaced it with sys.exit,
    and Ray's C++ handler printed a trace) and Ray is still up (its GCS and raylet were in
    the driver's group: the raylet stopped, and the driver's core worker exited 1)."""
    proc = subprocess.Popen([sys.executable, "-c", RAY_START], env=child_env(), cwd=tmp_path, process_group=0,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=60)[1][-3000:]
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0 and "ok [15]" in out, (proc.returncode, out, err[-3000:])
    assert "SIGTERM received" not in err, err[-3000:]


def test_ray_starts_its_processes_apart_from_the_driver_s_signals():
    """The mechanism of the test above without starting Ray: inside the context `ensure_ray`
    calls ray.init in, a process started as Ray starts its GCS and raylet
    (`ray._private.services.ConsolePopen`: a Ray upgrade that renames it fails here) gets a
    process group of its own, and the driver's SIGTERM handler, replaced as ray.init
    replaces it, is the driver's again after."""
    from ray._private import services

    from baton.controller.ray_backend import _apart_from_the_run_s_signals

    def mine(signum, frame):
        pass

    before, popen = signal.signal(signal.SIGTERM, mine), services.ConsolePopen
    try:
        with _apart_from_the_run_s_signals():
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # what ray.init does
            child = services.ConsolePopen([sys.executable, "-c", "import os; print(os.getpgrp())"],
                                          stdout=subprocess.PIPE, text=True)
            pgid = int(child.communicate(timeout=60)[0])
        assert pgid == child.pid != os.getpgrp()
        assert signal.getsignal(signal.SIGTERM) is mine and services.ConsolePopen is popen
    finally:
        signal.signal(signal.SIGTERM, before)


# --- the full forms: `baton train` as users run it, the signal to its process group --------
def baton_train(placement: str, run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "baton.cli", *argv(placement, run_dir, *extra)],
                            env={**child_env(), "BATON_PLACEMENT_AUTO": "0"}, cwd=run_dir.parent,
                            process_group=0, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"`baton train` did not end within {timeout} s: {proc.communicate()[1][-3000:]}")


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(DROP)} for r in read_metrics(run_dir)]


@pytest.mark.slow  # ~1 min per case on 2 cores: three runs of `baton train`, each starting its own Ray
@pytest.mark.parametrize("signame, code", [("SIGTERM", 143), ("SIGINT", 130)])
@pytest.mark.parametrize("placement", ["in_process", "one_step_off", "ray_dp"])
def test_a_signal_to_the_process_group_saves_and_resumes_exactly(placement, signame, code, tmp_path):
    """`baton train`, its whole process group signalled after step 2 (Ray's processes and the
    generator included, had they been in it): the step in progress is saved, one line, exit
    143 / 130, no child's trace; `trainer.resume=auto` then continues to the same metrics,
    line for line, as a run that was never stopped."""
    run = tmp_path / "run"
    proc = baton_train(placement, run, "trainer.steps=40")
    sig = getattr(signal, signame)
    sent = when(lambda: reached(run, 2), lambda: os.killpg(proc.pid, sig))
    err = finish(proc)
    assert "at" in sent, err[-3000:]
    assert proc.returncode == code, err[-3000:]
    assert "SIGTERM received" not in err and "logging.cc" not in err, err[-3000:]
    name = "SIGINT (Ctrl-C)" if signame == "SIGINT" else signame
    step = check_stopped_and_saved(run, one_line(err, "baton:"), name, 40)
    resumed = baton_train(placement, run, f"trainer.steps={step + 2}", "trainer.resume=auto")
    err = finish(resumed)
    assert resumed.returncode == 0, err[-3000:]
    whole = tmp_path / "whole"
    uninterrupted = baton_train(placement, whole, f"trainer.steps={step + 2}")
    err = finish(uninterrupted)
    assert uninterrupted.returncode == 0, err[-3000:]
    assert metrics(run) == metrics(whole)

