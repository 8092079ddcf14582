"""The same PPO steps with every role colocated vs the critic on a pool of its own.

    .venv/bin/python bench/ppo_split.py [--steps 8] [--recipe recipes/ppo_arithmetic.yaml]

Both runs use the Ray backend and the recipe's PPO (critic + GAE, critic warm-up off so
every step updates both), one torch thread per worker:

    colocated  placement.world_size=1: actor, rollout, reward, critic in ONE process
    split      + placement.pools.critic=1, placement.roles.critic=critic: the critic in a
               second process, so compute_values runs beside the rewards and
               update_actor || update_critic run at the same time

Prints per run the median step time and update time over steps 2..N, each update's median
duration, and the measured overlap of the two updates (from the run's timeline.jsonl: the
fraction of the shorter update that ran while the other did; see baton.trainers.session.timeline).
On a shared 2-core machine the split run can only be as fast as the free cores allow.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from baton.metrics import read_metrics
from baton.trainers.session import timeline
from _common import SMOKE_PPO, add_smoke, driver, load_rl_config  # bench/_common.py (run from bench/)

PLACEMENTS = {
    "colocated": ["placement.world_size=1"],
    "split": ["placement.world_size=1", "placement.pools.critic=1", "placement.roles.critic=critic"],
}


def run(recipe: str, name: str, steps: int, extra: list[str], root: Path) -> dict[str, float]:
    run_dir = root / name
    cfg = load_rl_config("ppo", recipe, [
        f"trainer.run_dir={run_dir}", f"trainer.steps={steps}", "trainer.progress=false", "trainer.eval_every=0",
        "data.eval_size=8", "critic.pretrain_steps=0", "placement.backend=ray", "placement.threads_per_worker=1",
        *PLACEMENTS[name], *extra])
    t0 = time.perf_counter()
    driver("ppo")[0](cfg)
    wall = time.perf_counter() - t0
    rows = [r for r in read_metrics(run_dir) if r["step"] > 1]  # step 1 warms caches up
    recs = [r for r in timeline.read(run_dir / timeline.TIMELINE_FILE) if r["step"] > 1]

    def dur(role: str, method: str) -> float:
        return statistics.median(r["end"] - r["start"] for r in recs if r["role"] == role and r["method"] == method)

    return {"step_s": statistics.median(r["timing/step_s"] for r in rows),
            "update_s": statistics.median(r["timing/update_s"] for r in rows),
            "actor_update_s": dur("actor", "update"), "critic_update_s": dur("critic", "update_critic"),
            "overlap": statistics.median(r["timeline/update_overlap"] for r in rows),
            "critic_pid_differs": len({r["pid"] for r in recs if r["role"] == "critic"}
                                      & {r["pid"] for r in recs if r["role"] == "actor"}) == 0,
            "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="recipes/ppo_arithmetic.yaml")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("overrides", nargs="*", help="extra dotted.key=value for both runs")
    add_smoke(p)
    args = p.parse_args()
    if args.smoke:
        args.overrides = [*SMOKE_PPO, *args.overrides]
        args.steps = 3
    with tempfile.TemporaryDirectory(prefix="ppo_split_") as tmp:
        results = {name: run(args.recipe, name, args.steps, args.overrides, Path(tmp)) for name in PLACEMENTS}
    print(f"\nPPO, {args.steps} steps ({args.recipe}), medians over steps 2..{args.steps}")
    print(f"{'placement':10s} {'step s':>8s} {'update s':>9s} {'actor upd s':>12s} {'critic upd s':>13s} "
          f"{'overlap':>8s} {'wall s':>7s}")
    for name, r in results.items():
        print(f"{name:10s} {r['step_s']:8.3f} {r['update_s']:9.3f} {r['actor_update_s']:12.3f} "
              f"{r['critic_update_s']:13.3f} {r['overlap']:8.2f} {r['wall_s']:7.1f}")
    c, s = results["colocated"], results["split"]
    print(f"split / colocated step time: {s['step_s'] / c['step_s']:.2f}x; update phase: "
          f"{s['update_s'] / c['update_s']:.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
