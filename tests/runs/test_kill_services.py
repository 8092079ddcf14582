"""Kill anywhere, second pass (issue 49): on the trajectory-API path, a service is SIGKILLed
mid-run and started again (the API on the same `--db` and port, `baton serve` on its port,
the environment with its arguments), then the trainer itself is SIGKILLed and resumed with
`trainer.resume=auto`: the run goes on after each, and its ledger lists the environment's
groups oldest first, each once (no group lost, none trained twice).

    env     the trainer waits for groups (saying so every 10 s) until the new env pushes
    api     the trainer's pull retries with backoff; the API serves what its database holds
    serve   the env's generation retries with backoff until the server is back

The restarted env starts its own prompt stream again (`--seed 0`): the API's groups, not
the env's prompts, are what the ledger counts (an env keeps no position of its own). All
slow: four processes, two trainer lives (1.5-3 min each on 2 busy cores). The moments are
drawn from a printed seed (BATON_KILL_SEED=N replays one). The long form: six lives, each
with a service killed and restarted (env, api, serve, api, env) and then the trainer.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from kill_anywhere import last_step, ledger_ids, seed_of, train_killed
from test_kill_anywhere import Services, api_argv


def services_then_trainer(run_dir: Path, services: Services, kinds: list[str], rng: random.Random):
    """Kill n of the trainer (n < len(kinds)) comes just after service `kinds[n]` was killed and
    started again. The service is killed once the life logged 1-2 new steps plus a drawn 0-0.2 s;
    the trainer runs on beside the dead service for a drawn 0.1-0.5 s (a failed pull, an env whose
    generation fails), and is then paused (SIGSTOP) while the service starts again: a start takes
    5-120 s here, the trainer would otherwise finish every step from the API's queue first (CI,
    cd9dabf) and never be killed. It is resumed (SIGCONT) once the service answers, and killed
    a drawn 0-0.2 s later. Every wait is on the harness's own clock, none on a step: a step
    from the API's queue takes ~0.1 s here, the queue holds 4 steps, and a starved harness sees
    steps late, so the run has room for 14 steps past the target (16 in all)."""
    def when(n: int, proc: subprocess.Popen):
        if n >= len(kinds):
            return lambda: False
        target, delay, state = last_step(run_dir) + rng.randint(1, 2), rng.uniform(0.0, 0.2), {}
        dead_s, then_s = rng.uniform(0.1, 0.5), rng.uniform(0.0, 0.2)
        print(f"life {n}: {kinds[n]} killed after step {target} + {delay:.2f} s, dead {dead_s:.2f} s, "
              f"the trainer killed {then_s:.2f} s after it is back")

        def due() -> bool:
            now = time.monotonic()
            if "back" in state:
                return now - state["back"] >= then_s
            if "killed" in state:
                if now - state["killed"] >= dead_s:
                    os.killpg(proc.pid, signal.SIGSTOP)
                    try:
                        services.start(kinds[n])
                    finally:
                        os.killpg(proc.pid, signal.SIGCONT)
                    state["back"] = time.monotonic()
                    print(f"life {n}: {kinds[n]} back at step {last_step(run_dir)}")
                return False
            if last_step(run_dir) >= target and now - state.setdefault("seen", now) >= delay:
                services.kill(kinds[n], expect_alive=True)
                state["killed"] = time.monotonic()
                print(f"life {n}: {kinds[n]} killed at step {last_step(run_dir)}")
            return False
        return due
    return when


def check_services(tmp_path: Path, kinds: list[str], steps: int, save_every: int) -> None:
    rng = random.Random(seed_of(f"services {' '.join(kinds)}"))
    killed = tmp_path / "killed"
    services = Services(tmp_path, "killed")
    try:
        found = train_killed(api_argv(killed, services.url, steps, save_every), killed,
                             services_then_trainer(killed, services, kinds, rng), len(kinds), steps)
    finally:
        services.stop()
    print(f"trainer killed after steps {found}")
    assert len(found) == len(kinds)
    assert ledger_ids(killed) == [f"g:{i}" for i in range(1, steps * 2 + 1)]  # the env's groups, each once


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["env", "api", "serve"])
def test_a_killed_service_is_restarted_and_nothing_is_lost_or_trained_twice(tmp_path, kind):
    check_services(tmp_path, [kind], steps=16, save_every=3)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_five_service_kills_each_followed_by_a_trainer_kill(tmp_path):
    check_services(tmp_path, ["env", "api", "serve", "api", "env"], steps=60, save_every=3)
