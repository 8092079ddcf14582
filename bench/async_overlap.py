"""Generation overlapped with the update: sync vs one_step_off vs async on the demo recipe.

    .venv/bin/python bench/async_overlap.py                  # everything (hours on a busy VM)
    .venv/bin/python bench/async_overlap.py --cases demo --modes sync one_step_off     # accuracy
    .venv/bin/python bench/async_overlap.py --cases speed latency --rounds 2            # speed

Runs `recipes/grpo_arithmetic.yaml` (one torch thread per process) per mode, one run after
the other in this process, and prints per mode: the median step time (steps without an
evaluation, from step 3 on), steps per second, the speed-up over sync, the fraction of the
overlap bound reached, the final held-out greedy accuracy, the training time (the sum of
the step times, evaluations included) to first reach the sync run's final accuracy (and
that accuracy less one standard error of the 200-prompt evaluation), and the mean policy
age. Each run's load average (before -> after) is printed beside it.

The overlap bound comes from the sync run's own phase medians (generation g, scoring s,
update u): a generator that overlaps the update perfectly makes a step cost
max(g + s, u) instead of g + s + u, so bound = (g + s + u) / max(g + s, u).

Modes: sync (the recipe: one process), one_step_off, async with max_staleness 1 and 2
(the rollout and the reward on a Ray worker of their own, the actor in this process; with
max_staleness 2 also with the decoupled PPO correction, algo.off_policy=decoupled_ppo), the
data-parallel alternative (placement.backend=ray placement.world_size=2: two actor +
rollout processes) and the two combined (world_size 2 + a generator: three processes on
two cores).

Cases:
  push     the cost of one weight push to the generator by each transport
           (rollout.weight_sync), for the demo model and a 25M-parameter one: the driver's
           call (what the trainer pays) and the time until the generator holds the weights
  demo     the recipe as shipped, --steps (300), every mode once: accuracy and time to it
  speed    the recipe for --short-steps (40) without evaluations, in --rounds interleaved
           rounds of every mode; speed-ups are paired with the sync run of the same round
           (minutes apart), so load that drifts between rounds cancels
  latency  as speed, with every reward call waiting 20 ms as a remote verifier would
           (`_latency_reward.py`), --reward-workers (32) calls in flight
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _latency_reward, in this and Ray's processes

from baton.metrics import read_metrics  # noqa: E402
from _common import SMOKE_TRAIN, add_smoke, driver, load_rl_config  # noqa: E402

MODES = {
    "sync": [],
    "one_step_off": ["trainer.mode=one_step_off"],
    "async_k1": ["trainer.mode=async", "trainer.max_staleness=1"],
    "async_k2": ["trainer.mode=async", "trainer.max_staleness=2"],
    "async_k2+decoupled": ["trainer.mode=async", "trainer.max_staleness=2", "algo.off_policy=decoupled_ppo"],
    "dp2": ["placement.backend=ray", "placement.world_size=2"],
    "dp2+one_step_off": ["placement.backend=ray", "placement.world_size=2", "trainer.mode=one_step_off"],
}


def case_overrides(case: str, args: argparse.Namespace) -> list[str]:
    if case == "demo":
        return [f"trainer.steps={args.steps}"] + ([f"trainer.eval_every={args.eval_every}"] if args.eval_every else [])
    short = [f"trainer.steps={args.short_steps}", "trainer.eval_every=0", "data.eval_size=20"]
    if case == "speed":
        return short
    return [*short, "reward.functions={_latency_reward:correct_after_20ms: 1.0}",
            f"reward.max_workers={args.reward_workers}"]


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run(case: str, mode: str, args: argparse.Namespace, root: Path) -> dict:
    run_dir = root / f"{case}-{mode}"
    cfg = load_rl_config("grpo", ROOT / "recipes/grpo_arithmetic.yaml", [
        f"model.path={ROOT / 'checkpoints/arith-sft'}", f"trainer.run_dir={run_dir}", "trainer.progress=false",
        "placement.threads_per_worker=1", *case_overrides(case, args), *MODES[mode],
        *(SMOKE_TRAIN if args.smoke else [])])
    before = load()
    t0 = time.perf_counter()
    driver("grpo")[0](cfg)
    wall = time.perf_counter() - t0
    rows = [r for r in read_metrics(run_dir) if r["step"] > 0]
    plain = [r for r in rows if r["step"] >= 3 and not any(k.startswith("eval/") for k in r)]
    med = lambda key: statistics.median(r.get(key, 0.0) for r in plain)  # noqa: E731
    elapsed, curve = 0.0, []
    for r in rows:
        elapsed += r["timing/step_s"]
        if "eval/accuracy_greedy" in r:
            curve.append((r["step"], elapsed, r["eval/accuracy_greedy"]))
    return {"case": case, "mode": mode, "wall_s": wall, "loop_s": elapsed, "step_s": med("timing/step_s"),
            "g": med("timing/rollout_s"), "s": med("timing/score_s"), "u": med("timing/update_s"),
            "sync": med("timing/sync_s"), "age": statistics.mean(r["rollout/policy_age"] for r in rows),
            "reward": statistics.mean(r["reward/mean"] for r in rows[-20:]),
            "curve": curve, "final": curve[-1][2] if curve else float("nan"), "load": f"{before} -> {load()}"}


def push_costs(args: argparse.Namespace, root: Path) -> None:
    from baton.models.make import make_tiny_checkpoint
    from baton.sources import row_source
    from baton.trainers.placement.roles import build_roles
    from baton.trainers.session.state import RunState

    models = {"demo 0.82M": str(ROOT / "checkpoints/arith-sft"),
              "25M": str(make_tiny_checkpoint(root / "m25", preset="25m", seed=0))}
    print("\n## weight push to the generator (actor in this process, generator on Ray)")
    print("| model | transport | driver call (ms) | until the generator holds them (ms) | load |")
    print("|---|---|---|---|---|")
    for label, path in models.items():
        for transport in ("object_store", "broadcast"):
            cfg = load_rl_config("grpo", ROOT / "recipes/grpo_arithmetic.yaml", [
                f"model.path={path}", f"trainer.run_dir={root / 'push'}", "trainer.mode=one_step_off",
                f"rollout.weight_sync={transport}", "placement.threads_per_worker=1", "data.eval_size=1"])
            state = RunState.fresh(cfg.data)
            roles = build_roles(cfg, probe_prompt=state.eval_rows[0]["prompt"])
            try:
                source = row_source(cfg, roles, state)
                source.total_steps = 0  # admit nothing: only pushes
                call, done, before = [], [], load()
                for version in range(1, args.push_reps + 2):
                    t0 = time.perf_counter()
                    source.weights_updated(version)
                    t1 = time.perf_counter()
                    source._check_pushes(version)  # waits for the generator's side
                    t2 = time.perf_counter()
                    if version > 1:  # the first push warms up
                        call.append(t1 - t0)
                        done.append(t2 - t0)
                print(f"| {label} | {transport} | {statistics.median(call) * 1e3:.1f} "
                      f"| {statistics.median(done) * 1e3:.1f} | {before} -> {load()} |", flush=True)
            finally:
                for group in {id(g): g for g in roles.values()}.values():
                    group.shutdown()


def time_to(curve: list[tuple[int, float, float]], target: float) -> str:
    hit = next((t for _, t, acc in curve if acc >= target), None)
    return f"{hit:.0f}" if hit is not None else "not reached"


def report(results: list[dict], args: argparse.Namespace) -> None:
    """Per case and mode: medians over rounds; speed-ups are paired (each run against the sync
    run of its own round, minutes apart), so a load that drifts between rounds cancels out."""
    for case in dict.fromkeys(r["case"] for r in results):
        runs = [r for r in results if r["case"] == case]
        bases = {r["round"]: r for r in runs if r["mode"] == "sync"}
        bound = {rd: (b["g"] + b["s"] + b["u"]) / max(b["g"] + b["s"], b["u"]) for rd, b in bases.items()}
        print(f"\n## {case} ({len(bases) or 1} round(s))")
        for rd, b in sorted(bases.items()):
            print(f"round {rd}: sync phases (median s) generation {b['g']:.3f}, scoring {b['s']:.3f}, update "
                  f"{b['u']:.3f}, sync {b['sync']:.3f}; overlap bound (g+s+u)/max(g+s,u) = {bound[rd]:.2f}x")
        base = bases.get(0)
        if base is not None and base["curve"] and len(base["curve"]) > 2:
            p = base["final"]
            noise = math.sqrt(p * (1 - p) / args.eval_size)
            print(f"sync's final greedy accuracy {p:.3f}; within noise: >= {p - noise:.3f} (one binomial "
                  f"standard error of {args.eval_size} held-out prompts, {noise:.3f})")
        print("| mode | step (s) | steps/s | vs sync (per round) | of bound | final acc | time to sync's final acc (s) "
              "| ... within noise (s) | training time (s) | mean age | reward, last 20 | load before -> after |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for mode in dict.fromkeys(r["mode"] for r in runs):
            rs = [r for r in runs if r["mode"] == mode]
            step = statistics.median(r["step_s"] for r in rs)
            speeds = [bases[r["round"]]["step_s"] / r["step_s"] for r in rs if r["round"] in bases]
            of_bound = [sp / bound[r["round"]] for sp, r in zip(speeds, rs)]
            vs = (f"{statistics.median(speeds):.2f}x ({' / '.join(f'{x:.2f}' for x in speeds)})"
                  if speeds and mode != "sync" else "1.00x")
            ofb = f"{statistics.median(of_bound):.0%}" if of_bound and mode != "sync" else "-"
            first = rs[0]
            reach = near = "-"
            if base is not None and base["curve"] and len(base["curve"]) > 2:
                p = base["final"]
                reach = time_to(first["curve"], p)
                near = time_to(first["curve"], p - math.sqrt(p * (1 - p) / args.eval_size))
            print(f"| {mode} | {step:.3f} | {1 / step:.2f} | {vs} | {ofb} | {first['final']:.3f} | {reach} | {near} "
                  f"| {first['loop_s']:.0f} | {first['age']:.2f} | {first['reward']:.3f} "
                  f"| {'; '.join(r['load'] for r in rs)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=["push", "demo", "speed", "latency"],
                    choices=["push", "demo", "speed", "latency"])
    ap.add_argument("--push-reps", type=int, default=10)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--steps", type=int, default=300, help="demo: steps per run")
    ap.add_argument("--eval-every", type=int, default=0, help="demo: steps between evaluations (0: the recipe's)")
    ap.add_argument("--eval-size", type=int, default=200, help="the recipe's data.eval_size (for the noise)")
    ap.add_argument("--short-steps", type=int, default=40, help="speed, latency: steps per run")
    ap.add_argument("--rounds", type=int, default=2, help="speed, latency: interleaved rounds of every mode")
    ap.add_argument("--reward-workers", type=int, default=32)
    ap.add_argument("--out", help="also write the runs' results here (JSON)")
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.cases, args.modes, args.rounds, args.push_reps = ["speed"], ["sync", "one_step_off"], 1, 1
        args.short_steps = 4  # medians from step 3 on; the last step evaluates
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results: list[dict] = []
    plan = [(0, "demo", m) for m in args.modes if "demo" in args.cases]
    plan += [(rd, c, m) for rd in range(args.rounds) for c in ("speed", "latency") if c in args.cases
             for m in args.modes]
    with tempfile.TemporaryDirectory(prefix="baton-async-bench-") as tmp:
        if "push" in args.cases:
            push_costs(args, Path(tmp))
        for rd, case, mode in plan:
            results.append({"round": rd, **run(case, mode, args, Path(tmp) / f"r{rd}")})
            r = results[-1]
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1))
            print(f"round {rd} {case}/{mode}: step {r['step_s']:.3f} s, final acc {r['final']:.3f}, "
                  f"wall {r['wall_s']:.0f} s, load {r['load']}", flush=True)
    report(results, args)


if __name__ == "__main__":
    main()
