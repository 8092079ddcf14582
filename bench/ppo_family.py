"""PPO (critic + GAE) vs GRPO vs RLOO vs ReMax on the same budget, one after the other.

    .venv/bin/python bench/ppo_family.py [--steps 150 --eval-every 50] [--only ppo,grpo]

Every run is `recipes/ppo_arithmetic.yaml` through the same driver (baton/trainers/ppo.py),
colocated on the local backend with 1 thread: the same SFT warm start, prompts (in the same
order), samples per prompt, actor optimizer and steps. Only the advantage changes:

    ppo    algo.advantage=gae with the recipe's critic (from the same SFT checkpoint)
    grpo   group-normalised rewards, no critic
    rloo   leave-one-out baseline, no critic
    remax  baseline = the reward of one extra greedy response per prompt, no critic

Prints held-out accuracy (greedy / sampled at T=1, 200 prompts) at each evaluation step and
each run's wall time, and writes the curves as JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from baton.metrics import read_metrics
from _common import SMOKE_PPO, add_smoke, driver, load_rl_config  # bench/_common.py (run from bench/)

METHODS = {
    "ppo": [],
    "grpo": ["critic=null", "algo.advantage=grpo"],
    "rloo": ["critic=null", "algo.advantage=rloo"],
    "remax": ["critic=null", "algo.advantage=remax"],
}


def run(recipe: str, name: str, steps: int, eval_every: int, extra: list[str], root: Path) -> dict:
    run_dir = root / name
    cfg = load_rl_config("ppo", recipe, [f"trainer.run_dir={run_dir}", f"trainer.steps={steps}",
                                          f"trainer.eval_every={eval_every}", "trainer.progress=false",
                                          "placement.backend=local", *METHODS[name], *extra])
    t0 = time.perf_counter()
    driver("ppo")[0](cfg)
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    curve = [(r["step"], r["eval/accuracy_greedy"], r["eval/accuracy_sampled"])
             for r in rows if "eval/accuracy_greedy" in r]
    steps_s = [r["timing/step_s"] for r in rows if "timing/step_s" in r]
    return {"curve": curve, "wall_s": wall, "mean_step_s": sum(steps_s) / len(steps_s)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="recipes/ppo_arithmetic.yaml")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--only", default=",".join(METHODS))
    p.add_argument("--out", default="")
    p.add_argument("overrides", nargs="*", help="extra dotted.key=value for every run")
    add_smoke(p)
    args = p.parse_args()
    if args.smoke:
        args.overrides = [*SMOKE_PPO, *args.overrides]
        args.steps, args.eval_every, args.only = 2, 1, "ppo"
    results = {}
    with tempfile.TemporaryDirectory(prefix="ppo_family_") as tmp:
        for name in args.only.split(","):
            results[name] = run(args.recipe, name, args.steps, args.eval_every, args.overrides, Path(tmp))
            print(f"{name}: {results[name]}", flush=True)
    evals = [s for s, _, _ in next(iter(results.values()))["curve"]]
    print(f"\nheld-out accuracy greedy / sampled (200 prompts), {args.steps} steps, steps {evals}")
    print(f"{'method':7s} " + " ".join(f"{'step ' + str(s):>13s}" for s in evals) + f" {'wall s':>7s} {'s/step':>7s}")
    for name, r in results.items():
        cells = " ".join(f"{g:6.3f}/{s:.3f}" for _, g, s in r["curve"])
        print(f"{name:7s} {cells} {r['wall_s']:7.0f} {r['mean_step_s']:7.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
