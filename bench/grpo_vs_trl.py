"""Benchmark: one GRPO step in baton vs in TRL's `GRPOTrainer`, same work, side by side.

    .venv/bin/python bench/grpo_vs_trl.py [--steps 20 --prompts 16 --G 8 --max-new-tokens 8
                                           --threads 1 --model checkpoints/arith-sft]

Both trainers get the same model directory, the same prompts in the same order (drawn by
baton's sampler; TRL's own shuffling is off and the script checks what TRL saw), G samples
per prompt, the same max new tokens, torch thread count, learning rate and loss settings
(no KL, clip 0.2/0.28, token-mean loss, group-normalised advantages, AdamW betas
(0.9, 0.99), constant LR, grad clip 1.0, fp32), and one optimizer step per generation batch.
Each side runs in its own fresh Python process, one after the other, so neither inherits
the other's threads, caches or allocator state.

Step times are per-step wall times without baton's start/end evaluation and checkpoint
save (TRL does neither inside a step); the first step is a warm-up and left out of medians.
Sampling is random on both sides, so rewards agree only statistically.
Needs the optional extra `bench` (`pip install trl`). TRL-specific settings: bench/_trl_side.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: _common, _trl_side (also in --child runs)
from _common import add_smoke  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "grpo_arithmetic.yaml"
DEFAULT_MODEL = REPO / "checkpoints" / "arith-sft"
SIDES = ("baton", "trl")


def baton_overrides(a: argparse.Namespace, run_dir: str) -> list[str]:
    """Recipe overrides that make baton's step the one TRL is configured to do."""
    rows = a.prompts * a.G
    ov = [f"trainer.steps={a.steps}", f"trainer.run_dir={run_dir}", "trainer.progress=false",
          "trainer.eval_every=0", "trainer.save_every=0", f"trainer.seed={a.seed}",
          f"model.path={a.model}", "model.dtype=float32", f"data.seed={a.seed}",
          f"data.prompts_per_step={a.prompts}", "data.eval_size=8",  # start/end eval: not timed, keep it short
          f"rollout.n={a.G}", f"rollout.max_new_tokens={a.max_new_tokens}",
          "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.top_k=0",
          "algo.kl_coef=0.0", "algo.loss_agg=token-mean", "algo.advantage=grpo",
          "actor.mini_batch_size=0", "actor.epochs=1", f"actor.micro_batch_size={rows}",  # one fwd/bwd, as TRL
          "actor.lr_warmup_steps=0", "actor.lr_schedule=constant", "actor.bf16=false",
          "placement.backend=local", "placement.world_size=1", f"placement.threads_per_worker={a.threads}"]
    if a.lr is not None:
        ov.append(f"actor.lr={a.lr}")
    return ov


# ----------------------------------------------------------------------------- child processes

def run_baton(spec: dict[str, Any]) -> list[dict[str, float]]:
    from _common import driver, load_rl_config

    cfg = load_rl_config("grpo", RECIPE, spec["overrides"])
    driver("grpo")[0](cfg)
    records = []
    for line in open(Path(cfg.trainer.run_dir) / "metrics.jsonl"):
        m = json.loads(line)
        if m.get("step", 0) < 1 or "timing/step_s" not in m:
            continue  # step 0 is the start-of-run evaluation
        # The last step also evaluates and saves a checkpoint: not part of a GRPO step.
        step_s = m["timing/step_s"] - m.get("timing/eval_s", 0.0) - m.get("timing/save_s", 0.0)
        ph = {k: m.get(f"timing/{k}", 0.0) for k in ("rollout_s", "reward_s", "update_s")}
        ph["reward_s"] += m.get("timing/score_s", 0.0)  # baton's scoring phase (rewards; no ref here)
        records.append({"step_s": step_s, **ph, "other_s": step_s - sum(ph.values()),
                        "tokens": float(m["rollout/tokens"]), "reward": m["reward/mean"]})
    return records


def run_trl_side(spec: dict[str, Any]) -> list[dict[str, float]]:
    from _trl_side import run_trl

    return run_trl(spec["model"], spec["step_rows"], G=spec["G"], max_new_tokens=spec["max_new_tokens"],
                   lr=spec["lr"], reward_weights=spec["reward_weights"], seed=spec["seed"],
                   clip_low=spec["clip_low"], clip_high=spec["clip_high"])


def child_main(side: str, spec_path: str, out_path: str) -> None:
    import torch

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    t0 = time.perf_counter()
    records = run_baton(spec) if side == "baton" else run_trl_side(spec)
    extra: dict[str, Any] = {"wall_s": time.perf_counter() - t0}
    if side == "trl":
        import trl
        extra["version"] = trl.__version__
    Path(out_path).write_text(json.dumps({"records": records, **extra}))


# ----------------------------------------------------------------------------- parent

def prepare(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Resolve the model, load baton's config, and draw the prompts of every step."""
    from _common import load_rl_config

    from baton.trainers.run_state import RunState

    if a.model is None:
        if (DEFAULT_MODEL / "config.json").exists():
            a.model = str(DEFAULT_MODEL)
        else:
            from baton.models.make import make_tiny_checkpoint

            print(f"note: {DEFAULT_MODEL} not found; using a random tiny model ({a.preset}) instead")
            a.model = str(make_tiny_checkpoint(work / "model", preset=a.preset))
    a.model = str(Path(a.model).resolve())
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"--model {a.model}: not a local HF model directory (no config.json)")
    overrides = baton_overrides(a, str(work / "baton_run"))
    cfg = load_rl_config("grpo", RECIPE, overrides)
    state = RunState.fresh(cfg.data)  # the very sampler the baton trainer draws its prompts from
    step_rows = [state.sampler.next_batch(a.prompts) for _ in range(a.steps)]
    return {"overrides": overrides, "model": a.model, "step_rows": step_rows, "G": a.G,
            "max_new_tokens": a.max_new_tokens, "lr": cfg.actor.lr, "seed": a.seed, "threads": a.threads,
            "reward_weights": dict(cfg.reward.functions), "clip_low": cfg.algo.clip_low,
            "clip_high": cfg.algo.clip_high}


def launch(side: str, spec_path: Path, work: Path, threads: int) -> dict[str, Any]:
    out, log = work / f"{side}.json", work / f"{side}.log"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    print(f"running {side} ...", flush=True)
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, __file__, "--child", side, str(spec_path), str(out)],
                            stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
    if rc != 0:
        sys.exit(f"{side} run failed (exit {rc}); last lines of its log:\n"
                 + "".join(log.read_text().splitlines(True)[-30:]))
    return json.loads(out.read_text())


def summarise(records: list[dict[str, float]], k: int) -> dict[str, float]:
    timed = records[1:] or records  # step 1 is a warm-up (first allocations, lazy inits)
    s = {key: statistics.median(r[key] for r in timed)
         for key in ("step_s", "rollout_s", "reward_s", "update_s", "other_s")}
    s["tokens_per_s"] = statistics.median(r["tokens"] / r["step_s"] for r in timed)
    s["tokens_per_step"] = statistics.mean(r["tokens"] for r in records)
    s["reward_first"] = statistics.mean(r["reward"] for r in records[:k])
    s["reward_last"] = statistics.mean(r["reward"] for r in records[-k:])
    return s


def print_table(a: argparse.Namespace, res: dict[str, dict[str, Any]]) -> None:
    k = max(1, min(5, a.steps // 4))  # steps averaged for "first" and "last" reward
    b = summarise(res["baton"]["records"], k)
    if "trl" not in res:
        print(f"\nbaton only (TRL not installed: `pip install -e .[bench]` for the comparison): "
              f"median step {b['step_s']:.3f} s (rollout {b['rollout_s']:.3f}, update {b['update_s']:.3f}), "
              f"{a.prompts} prompts x G={a.G}, max_new_tokens={a.max_new_tokens}, {a.steps} steps")
        return
    t = summarise(res["trl"]["records"], k)
    print(f"\nGRPO step: baton vs TRL {res['trl'].get('version', '?')} | model {a.model}")
    print(f"{a.prompts} prompts x G={a.G} = {a.prompts * a.G} samples/step, max_new_tokens={a.max_new_tokens}, "
          f"{a.steps} steps, torch threads={a.threads}, fp32, CPU")
    print(f"medians over steps 2..{a.steps} (step 1 = warm-up)\n")
    rows = [("step time (s)", "step_s", 3), ("  rollout (s)", "rollout_s", 3), ("  reward (s)", "reward_s", 4),
            ("  update (s)", "update_s", 3), ("  other (s)", "other_s", 4),
            ("completion tokens/s", "tokens_per_s", 0), ("completion tokens/step (mean)", "tokens_per_step", 1)]
    print(f"{'':32s}{'baton':>10s}{'TRL':>10s}{'TRL/baton':>11s}")
    for label, key, nd in rows:
        timed = key.endswith("_s") and key != "tokens_per_s"
        ratio = f"{t[key] / b[key]:10.2f}x" if timed and b[key] > 0 else ""
        print(f"{label:32s}{b[key]:10.{nd}f}{t[key]:10.{nd}f}{ratio}")
    print(f"{f'mean reward, first {k} steps':32s}{b['reward_first']:10.3f}{t['reward_first']:10.3f}")
    print(f"{f'mean reward, last {k} steps':32s}{b['reward_last']:10.3f}{t['reward_last']:10.3f}")
    print(f"{'process wall, setup+eval (s)':32s}{res['baton']['wall_s']:10.1f}{res['trl']['wall_s']:10.1f}")
    print(f"\nbaton/TRL speed (TRL median step time / baton's): {t['step_s'] / b['step_s']:.2f}x")
    print("other = step - rollout - reward - update (baton: advantages, weight sync, metrics; "
          "TRL: tokenising, advantages, bookkeeping)")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(*argv[1:4])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--G", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    p.add_argument("--model", default=None, help=f"local HF model dir (default {DEFAULT_MODEL} if present, "
                                                 "else a random tiny model)")
    p.add_argument("--preset", default="2m", help="tiny preset when no model exists")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the recipe's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--order", default="baton,trl", help="which side runs first")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, run dirs)")
    add_smoke(p)
    a = p.parse_args(argv)
    if a.smoke:
        a.steps, a.prompts, a.G, a.max_new_tokens, a.preset = 2, 2, 2, 4, "0.75m"
    if a.steps < 2 or a.G < 2:
        p.error("need --steps >= 2 (step 1 is a warm-up) and --G >= 2 (GRPO groups)")
    order = a.order.split(",")
    if sorted(order) != sorted(SIDES):
        p.error(f"--order must name both of {SIDES}")

    work = Path(tempfile.mkdtemp(prefix="grpo-vs-trl-"))
    try:
        spec_path = work / "spec.json"
        spec_path.write_text(json.dumps(prepare(a, work)))
        try:
            import trl  # noqa: F401
        except ImportError:
            print("note: TRL is not installed: running baton's side only")
            order = ["baton"]
        res = {side: launch(side, spec_path, work, a.threads) for side in order}
        print_table(a, res)
    finally:
        if a.keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
