"""Benchmark: the demo recipe's step time under each placement `placement: auto` chooses among.

    .venv/bin/python bench/placement.py [--steps 8 --rounds 1 --recipe recipes/grpo_arithmetic.yaml]

Each candidate runs the recipe for --steps steps (no evaluation, no checkpoint) in a fresh
`baton train` process of its own, one after the other, --rounds interleaved rounds; printed:
the median step time over steps 3..N per candidate, its speed-up over one process with one
thread (paired within a round), and the load average before -> after, since on a shared
machine the load moves the numbers.

Candidates: one process with 1 thread and with one thread per core; data parallel
(placement.backend=ray, world_size = cores, 1 thread per rank); one_step_off (the
generator in a second process); the two combined; and `auto`, the plain command (what
`placement.auto` chooses; its one line is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, SMOKE_TRAIN, add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)


def candidates(cores: int) -> dict[str, list[str]]:
    """Each candidate with placement.auto=false (what it names and nothing else), and `auto`:
    the command as a user types it (whatever `placement.auto` chooses on this machine)."""
    dp = ["placement.backend=ray", f"placement.world_size={cores}", "placement.threads_per_worker=1"]
    hand = {"1 process, 1 thread": ["placement.threads_per_worker=1"],
            f"1 process, {cores} threads": [f"placement.threads_per_worker={cores}"],
            f"dp{cores} (ray)": dp,
            "one_step_off": ["trainer.mode=one_step_off", "placement.threads_per_worker=1"],
            f"dp{cores} + one_step_off": [*dp, "trainer.mode=one_step_off"]}
    return {**{k: ["placement.auto=false", *v] for k, v in hand.items()}, "auto": []}


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run(recipe: str, extra: list[str], run_dir: Path) -> dict:
    argv = [sys.executable, "-m", "baton.cli", "train", recipe, f"trainer.run_dir={run_dir}",
            "trainer.overwrite=true", "trainer.progress=false", "trainer.eval_every=0", "trainer.save_every=0",
            "data.eval_size=8", *extra]
    before, t0 = load(), time.perf_counter()
    p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                            "BATON_PLACEMENT_AUTO": "1"})
    if p.returncode != 0:
        sys.exit(f"baton train {' '.join(extra)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    chose = [x for x in p.stdout.splitlines() if x.startswith("placement auto:")]
    if chose:
        print(chose[0], flush=True)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if r.get("step", 0) >= 3 and "timing/step_s" in r
             and not any(k.startswith("eval/") for k in r)]
    med = lambda k: statistics.median(r.get(k, 0.0) for r in steps)  # noqa: E731
    return {"step_s": med("timing/step_s"), "rollout_s": med("timing/rollout_s"), "update_s": med("timing/update_s"),
            "wall_s": time.perf_counter() - t0, "load": f"{before} -> {load()}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(REPO / "recipes/grpo_arithmetic.yaml"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--only", default="", help=";-separated candidate names (default: all)")
    ap.add_argument("overrides", nargs="*", help="extra dotted.key=value for every run (e.g. model.path=DIR)")
    add_smoke(ap)
    a = ap.parse_args()
    cands = candidates(a.cores)
    extra: list[str] = [f"trainer.steps={a.steps}", *a.overrides]
    if a.smoke:
        extra = ["trainer.steps=4", *SMOKE_TRAIN, *a.overrides]
        cands = {k: v for k, v in cands.items() if k == "1 process, 1 thread"}
    if a.only:
        cands = {k: v for k, v in cands.items() if k in a.only.split(";")}
    res: dict[str, list[dict]] = {k: [] for k in cands}
    with tempfile.TemporaryDirectory(prefix="bench-placement-") as tmp:
        for rd in range(a.rounds):
            for name, ov in cands.items():
                r = run(a.recipe, [*extra, *ov], Path(tmp) / f"r{rd}-{len(res[name])}-{name.split()[0]}")
                res[name].append(r)
                print(f"round {rd} {name}: step {r['step_s']:.3f} s (rollout {r['rollout_s']:.3f}, update "
                      f"{r['update_s']:.3f}), wall {r['wall_s']:.0f} s, load {r['load']}", flush=True)
    base = res.get("1 process, 1 thread")
    print(f"\n{Path(a.recipe).name}, {a.steps} steps, medians over steps 3..N, {a.cores} cores")
    print("| placement | step (s) | rollout (s) | update (s) | vs 1 process 1 thread | load before -> after |")
    print("|---|---|---|---|---|---|")
    for name, rs in res.items():
        sp = [b["step_s"] / r["step_s"] for b, r in zip(base, rs)] if base else []
        vs = f"{statistics.median(sp):.2f}x" if sp else "-"
        med = {k: statistics.median(r[k] for r in rs) for k in ("step_s", "rollout_s", "update_s")}
        print(f"| {name} | {med['step_s']:.3f} | {med['rollout_s']:.3f} | {med['update_s']:.3f} | {vs} "
              f"| {'; '.join(r['load'] for r in rs)} |")


if __name__ == "__main__":
    main()
