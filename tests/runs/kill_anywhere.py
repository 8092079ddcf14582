"""The kill-anywhere harness (issue 49): `baton train` in a process group of its own, SIGKILLed
(nothing gets to save) at moments drawn from a printed seed, resumed each time with
`trainer.resume=auto` until it finishes; its ledger (`baton.trainers.session.ledger`) and metrics are then
compared with an uninterrupted run's by the tests (tests/runs/test_kill_anywhere.py).

    kills = train_killed(argv, run_dir, when=after_new_step(run_dir, rng), kills=5)

`when(n, proc)` returns a callable that says when kill n of the trainer `proc` is due: a drawn number of new steps' lines
since the last (re)start (so every life trains), then a seeded random delay (any moment of a step: the
rollout, the update, the checkpoint), or an event of the services (the API has handed out a
batch). Nothing asserted depends on when a kill lands: every moment must be survivable.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from runs_helpers import REPO, child_env

from baton.metrics import read_metrics
from baton.trainers.session.ledger import read_ledger

EVENT_S = 180.0  # how long one life may take to reach its kill or the end: catches hangs only
DROP = ("timing/", "throughput/")  # what differs between two runs of the same steps


def last_step(run_dir: Path) -> int:
    """The newest step with a metrics line (a torn last line is not one yet); 0 for none."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return 0


def baton_train(argv: list[str], cwd: Path, log) -> subprocess.Popen:
    """`baton train ARGV` in a process group of its own (its reward workers with it)."""
    return subprocess.Popen([sys.executable, "-m", "baton.cli", "train", *argv],
                            env={**child_env(), "BATON_PLACEMENT_AUTO": "0"}, cwd=cwd, process_group=0,
                            stdout=subprocess.DEVNULL, stderr=log)


def after_new_step(run_dir: Path, rng: random.Random, max_delay_s: float = 0.3,
                   span: int = 2) -> Callable[[int, subprocess.Popen], Callable[[], bool]]:
    """Kill n is due once the run logged 1..`span` (drawn) steps since its start, plus a drawn
    delay of up to `max_delay_s` (within the next step: the rollout, the update, the checkpoint)."""
    def when(n: int, proc: subprocess.Popen) -> Callable[[], bool]:
        target, delay, seen = last_step(run_dir) + rng.randint(1, span), rng.uniform(0.0, max_delay_s), []

        def due() -> bool:
            if not seen and last_step(run_dir) >= target:
                seen.append(time.monotonic())
            return bool(seen) and time.monotonic() - seen[0] >= delay
        return due
    return when


def train_killed(argv: list[str], run_dir: Path, when: Callable[[int, subprocess.Popen], Callable[[], bool]], kills: int,
                 steps: int) -> list[int]:
    """Run `baton train ARGV trainer.resume=auto`, SIGKILL it at `when(n)` (n < `kills`; a
    life that ends first is not killed), resuming each time until it ends; returns the last
    step logged when each kill came."""
    found, n = [], 0
    err = run_dir.parent / f"{run_dir.name}.stderr"
    while True:
        with open(err, "a") as log:
            proc = baton_train([*argv, "trainer.resume=auto"], run_dir.parent, log)
        due = when(n, proc) if n < kills else (lambda: False)
        deadline = time.monotonic() + EVENT_S
        while proc.poll() is None and not due():
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise AssertionError(f"life {n} of {run_dir} neither ended nor reached its kill in {EVENT_S} s: "
                                     f"{err.read_text()[-3000:]}")
            time.sleep(0.02)
        if proc.poll() is None:
            found.append(last_step(run_dir))  # the last step's line too: its checkpoint may be in progress
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            n += 1
            continue
        assert proc.returncode == 0, err.read_text()[-3000:]
        if last_step(run_dir) >= steps:
            return found
        n += 1  # it ended (a kill that landed as it finished is not one): start again


def uninterrupted(argv: list[str], run_dir: Path) -> None:
    with open(run_dir.parent / f"{run_dir.name}.stderr", "a") as log:
        proc = baton_train(argv, run_dir.parent, log)
    assert proc.wait(timeout=EVENT_S) == 0, (run_dir.parent / f"{run_dir.name}.stderr").read_text()[-3000:]


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(DROP)} for r in read_metrics(run_dir)]


def ledger_ids(run_dir: Path) -> list[str]:
    return [str(i) for e in read_ledger(run_dir) for i in e["ids"]]


def ledger_steps(run_dir: Path) -> list[list[str]]:
    """Each step's ids, sorted: what a step trained, whatever order its groups finished in."""
    return [sorted(str(i) for i in e["ids"]) for e in read_ledger(run_dir)]


def run_argv(base: list[str], run_dir: Path, steps: int, save_every: int) -> list[str]:
    return [*base, f"trainer.run_dir={run_dir}", f"trainer.steps={steps}", f"trainer.save_every={save_every}"]


def check_killed(tmp_path: Path, name: str, base: list[str], steps: int, save_every: int, kills: int, span: int,
                 same_metrics: bool = True) -> list[int]:
    """An uninterrupted run of `base` and one SIGKILLed `kills` times (after 1..`span` new
    steps each life, seeded: printed) and resumed: their ledgers equal (no prompt lost, none
    trained twice) and, `same_metrics` (a deterministic path), in the same order within each
    step, and so is every step's metrics line (else each step trains the same groups, in the
    order they finished). Returns the last step logged at each kill."""
    rng = random.Random(seed_of(f"{name} {kills} kill(s)"))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    uninterrupted(run_argv(base, whole, steps, save_every), whole)
    found = train_killed(run_argv(base, killed, steps, save_every), killed, after_new_step(killed, rng, span=span),
                         kills, steps)
    print(f"killed after steps {found}")
    assert len(found) == kills
    assert ledger_steps(killed) == ledger_steps(whole)
    assert len(set(ledger_ids(whole))) > steps  # the ledger says something: distinct prompts
    if same_metrics:
        assert ledger_ids(killed) == ledger_ids(whole)
        assert metrics(killed) == metrics(whole)
    return found


def seed_of(name: str) -> int:
    """The kill times' seed: BATON_KILL_SEED to replay a failure, else a fresh one (printed)."""
    seed = int(os.environ.get("BATON_KILL_SEED") or random.SystemRandom().randrange(2**31))
    print(f"{name}: kill seed {seed} (replay: BATON_KILL_SEED={seed})")
    return seed


__all__ = ["REPO", "after_new_step", "check_killed", "last_step", "ledger_ids", "ledger_steps", "metrics",
           "run_argv", "seed_of", "train_killed", "uninterrupted"]
