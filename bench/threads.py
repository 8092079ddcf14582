"""Benchmark: `placement.auto`'s thread count against 1 and 2 threads a process, on a quiet
machine and with a busy loop on every core (started by this script), side by side.

    .venv/bin/python bench/threads.py [--steps 6 --rounds 2 --recipe recipes/grpo_arithmetic.yaml]

The recipe, its `placement:` section removed (as in `examples/own_data/grpo.yaml`, whose
reward module needs its own directory), runs as a user types it (`auto`: whatever `placement.auto` chooses on this machine; its one
line is printed) and with `placement.threads_per_worker` set to 1 and to the machine's core
count. Each run is a fresh `baton train` process (bench/placement.py's `run`); the conditions
alternate within a round: "quiet" (nothing started by this script; on a shared machine
the load average says how quiet it was) and "busy" (one `while True: pass` process per core,
started before the runs of that condition and stopped after them, by pid). Printed: the
median step time over steps 3..N per candidate and condition, and each one's ratio to the
best of that condition (auto's goal: within 10% of the best in both).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from _common import REPO, SMOKE_TRAIN, add_smoke
from placement import load, run  # bench/placement.py: one `baton train` run, its medians


@contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """`n` processes spinning on a core each for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def without_placement(recipe: str, out: Path) -> str:
    """A copy of `recipe` with no `placement:` section and its model path absolute."""
    import yaml

    data = yaml.safe_load(Path(recipe).read_text())
    data.pop("placement", None)
    model = Path(data["model"]["path"])
    data["model"]["path"] = str(model if model.is_absolute() else (REPO / model).resolve())
    out.write_text(yaml.safe_dump(data))
    return str(out)


def candidates(cores: int) -> dict[str, list[str]]:
    return {"auto (default)": [], "1 thread": ["placement.threads_per_worker=1"],
            f"{cores} threads": [f"placement.threads_per_worker={cores}"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(REPO / "recipes/grpo_arithmetic.yaml"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--conditions", default="quiet,busy", help="comma-separated: quiet, busy")
    ap.add_argument("--only", default="", help=";-separated candidate names (default: all)")
    ap.add_argument("overrides", nargs="*", help="extra dotted.key=value for every run")
    add_smoke(ap)
    a = ap.parse_args()
    cands = candidates(a.cores)
    extra = [f"trainer.steps={a.steps}", *a.overrides]
    conditions = a.conditions.split(",")
    if a.only:
        cands = {k: v for k, v in cands.items() if k in a.only.split(";")}
    if a.smoke:  # one short busy run on one thread: the script and its busy loops work
        a.steps = 4
        extra, conditions = ["trainer.steps=4", *SMOKE_TRAIN, *a.overrides], ["busy"]
        cands = {"1 thread": cands["1 thread"]}
    res: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        recipe = without_placement(a.recipe, Path(tmp) / "recipe.yaml")
        for rd in range(a.rounds):
            for cond in conditions:
                with busy_loops(a.cores if cond == "busy" else 0):
                    for name, ov in cands.items():
                        rdir = Path(tmp) / f"r{rd}-{cond}-{len(res)}"
                        r = run(recipe, [*extra, *ov], rdir)
                        res.setdefault((cond, name), []).append(r["step_s"])
                        print(f"round {rd} {cond} {name}: step {r['step_s']:.3f} s (rollout {r['rollout_s']:.3f}, "
                              f"update {r['update_s']:.3f}), load {r['load']}", flush=True)
    print(f"\n{Path(a.recipe).name}, {a.steps} steps, median step time over steps 3..N, {a.cores} cores, "
          f"load now {load()}")
    print("| condition | placement | step (s) | vs the best of the condition |")
    print("|---|---|---|---|")
    for cond in conditions:
        meds = {n: statistics.median(v) for (c, n), v in res.items() if c == cond}
        best = min(meds.values())
        for n, s in meds.items():
            print(f"| {cond} | {n} | {s:.3f} | {s / best:.2f}x |")


if __name__ == "__main__":
    main()
