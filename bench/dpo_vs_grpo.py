"""Benchmark: online DPO next to GRPO on the arithmetic task, same budget, side by side.

    .venv/bin/python bench/dpo_vs_grpo.py [--steps 150 --eval-every 25 --out runs/dpo_vs_grpo
                                           --dpo k=v ... --grpo k=v ...]

Both start from `checkpoints/arith-sft` with their shipped recipes
(`recipes/grpo_arithmetic.yaml`, `recipes/online_dpo_arithmetic.yaml`): the same prompts in
the same order (data.seed), 64 prompts x 8 samples a step, the same number of steps, one
torch thread. Each runs in its own fresh `baton` process, one after the other, so neither
inherits the other's threads or caches. Prints held-out accuracy (200 unseen prompts,
greedy and sampled at T=1 with 4 samples each) at the evaluated steps, and each run's wall
time (the process, model loading and evaluations included) and median step time.
`--dpo` / `--grpo` pass extra dotted overrides to one side.
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

from _common import SMOKE_TRAIN, add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

REPO = Path(__file__).resolve().parent.parent
SIDES = {"grpo": ("train", "recipes/grpo_arithmetic.yaml"),
         "online_dpo": ("online-dpo", "recipes/online_dpo_arithmetic.yaml")}


def run_side(name: str, a: argparse.Namespace, extra: list[str]) -> dict:
    command, recipe = SIDES[name]
    run_dir = Path(a.out) / name
    args = [sys.executable, "-m", "baton.cli", command, str(REPO / recipe), f"trainer.steps={a.steps}",
            f"trainer.eval_every={a.eval_every}", f"trainer.run_dir={run_dir}", "trainer.overwrite=true",
            "trainer.progress=false", "placement.threads_per_worker=1", *(SMOKE_TRAIN if a.smoke else []), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    subprocess.run(args, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = {r["step"]: (r["eval/accuracy_greedy"], r["eval/accuracy_sampled"])
             for r in rows if "eval/accuracy_greedy" in r}
    steps = [r["timing/step_s"] for r in rows if "timing/step_s" in r]
    return {"wall_s": wall, "step_s": statistics.median(steps), "evals": evals}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--out", default="runs/dpo_vs_grpo")
    p.add_argument("--dpo", nargs="*", default=[], help="extra overrides for online DPO")
    p.add_argument("--grpo", nargs="*", default=[], help="extra overrides for GRPO")
    add_smoke(p)
    a = p.parse_args()
    if a.smoke:
        a.steps, a.eval_every, a.out = 2, 0, tempfile.mkdtemp(prefix="bench-smoke-")
    res = {"grpo": run_side("grpo", a, a.grpo), "online_dpo": run_side("online_dpo", a, a.dpo)}
    print(f"held-out accuracy (greedy / sampled), {a.steps} steps of 64 prompts x 8 samples")
    print(f"{'step':>5} | {'GRPO':>15} | {'online DPO':>15}")
    for step in sorted(set(res["grpo"]["evals"]) | set(res["online_dpo"]["evals"])):
        cells = []
        for side in ("grpo", "online_dpo"):
            g = res[side]["evals"].get(step)
            cells.append(f"{g[0]:.3f} / {g[1]:.3f}" if g else "-")
        print(f"{step:>5} | {cells[0]:>15} | {cells[1]:>15}")
    for side in ("grpo", "online_dpo"):
        print(f"{side}: wall {res[side]['wall_s']:.0f} s (process, loading and evaluations included), "
              f"median step {res[side]['step_s']:.2f} s")
    (Path(a.out) / "summary.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
