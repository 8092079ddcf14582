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
drawn from a printed seed (BATON_KILL_SEED=N replays one).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from kill_anywhere import last_step, ledger_ids, seed_of, train_killed
from test_kill_anywhere import Services, api_argv

STEPS, SAVE_EVERY = 8, 3


def service_then_trainer(run_dir: Path, services: Services, kind: str, rng: random.Random):
    """Kill 0 of the trainer is due one step after `kind` was killed and restarted, which is
    once the run logged 1-2 new steps plus a drawn delay; no later kill."""
    target, delay = rng.randint(1, 2), rng.uniform(0.0, 0.5)
    print(f"{kind} killed after step {target} + {delay:.2f} s")

    def when(n: int):
        state: dict[str, float] = {}

        def due() -> bool:
            step = last_step(run_dir)
            if n > 0:
                return False
            if "restarted" not in state:
                if step >= target:
                    state.setdefault("seen", time.monotonic())
                    if time.monotonic() - state["seen"] >= delay:
                        services.restart(kind)
                        state["restarted"] = step
                return False
            return step > state["restarted"]
        return due
    return when


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["env", "api", "serve"])
def test_a_killed_service_is_restarted_and_nothing_is_lost_or_trained_twice(tmp_path, kind):
    rng = random.Random(seed_of(f"service {kind}"))
    killed = tmp_path / "killed"
    services = Services(tmp_path, "killed")
    try:
        found = train_killed(api_argv(killed, services.url, STEPS, SAVE_EVERY), killed,
                             service_then_trainer(killed, services, kind, rng), 1, STEPS)
    finally:
        services.stop()
    print(f"trainer killed after steps {found}")
    assert len(found) == 1
    assert ledger_ids(killed) == [f"g:{i}" for i in range(1, STEPS * 2 + 1)]
