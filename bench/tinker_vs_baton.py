"""Benchmark: the same GRPO run two ways, side by side in one invocation: a loop written
against the official Tinker SDK driving `baton tinker`, and `baton train` of the recipe.

    python bench/tinker_vs_baton.py [--steps 30 --prompts 64 --n 8 --lr 2e-3 --rank 8
                                     --max-tokens 4 --warmup 5 --seed 0 --work DIR --arms tinker,baton]
    python bench/tinker_vs_baton.py --smoke  # 2 steps each, 4 prompts x 4 (CI's tinker job)

Needs the `tinker` extra (the SDK). Both arms start from `checkpoints/arith-sft` (the README's
demo) on the arithmetic task and take, each step:

    tinker  a LoRA training client (rank, alpha 32, seed 0, no unembedding adapter) on a
            `baton tinker` subprocess (one torch thread); `save_weights_for_sampler`, a sampling
            client on that path, `--n` samples (T=1, `--max-tokens`, a seed per request) for
            each of the step's prompts; reward 1 for the exact answer; GRPO advantages (r - mean) / (std + 1e-6)
            (unbiased std) divided by the step's sampled-token count (Tinker's losses are sums,
            the recipe's token-mean divides by that count); groups whose rewards are all equal
            are not sent (their advantage is 0: no gradient, as in tinker-cookbook's rl_loop);
            one `forward_backward` with `ppo` (clip 0.8 / 1.28) and one `optim_step` (AdamW,
            the recipe's betas 0.9 / 0.99, eps 1e-8, grad clip 1.0, the same linear warm-up).
    baton   `baton train recipes/grpo_arithmetic.yaml` in this process with the same model, the
            same prompts per step (data.seed 0: the loop draws its prompts from the same
            seeded PromptSampler over the task's training rows), rollout.n, max tokens, LoRA
            rank and alpha, lr and warm-up, and one optimizer step per rollout batch
            (mini_batch_size = prompts x n); grpo + ppo_clip 0.2 / 0.28, token-mean.

Both train LoRA adapters, so the lr is LoRA's (2e-3), not the recipe's full fine-tuning 1e-4.

The two take the same first step on the same rows (tests/tinker_api/test_tinker_same_first_step.py);
what differs is only the samples (each arm's own random draws) and where the work runs (HTTP
and a server's one-datum-at-a-time forward passes against baton's batched rollout and update).
Printed: each step's mean reward of both arms, the means of blocks of `--block` steps, and the
median seconds per step of each and their ratio (the tinker loop's step: sampling, scoring and
its two training calls, measured around the loop body, and the part of it spent saving the
weights and sampling; baton's: `timing/step_s`, without evaluation). Exit 1 if an arm fails.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import DEMO_MODEL, REPO, add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

sys.path.insert(0, str(REPO / "scripts"))
from tinker_cookbook_loops import KEY, Server  # noqa: E402  (scripts/: the `baton tinker` subprocess)

NAME = "arith-sft"
CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}  # the recipe's ppo_clip 0.2 / 0.28


def lr_at(args: argparse.Namespace, step: int) -> float:
    """The recipe's schedule (baton.workers.optim.lr_factor: linear warm-up, then constant)."""
    from baton.workers.optim import lr_factor

    return args.lr * lr_factor(step, warmup_steps=args.warmup, total_steps=args.steps, schedule="constant")


def tinker_arm(args: argparse.Namespace, url: str) -> list[dict]:
    """The SDK loop; one {"reward", "seconds"} per step."""
    import numpy as np
    import tinker
    import torch
    from tinker import types

    from baton.algos.advantages import grpo_advantages
    from baton.data.prompts import PromptSampler
    from baton.data.records import prompt_ids
    from baton.envs import ArithmeticTask, verify

    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    tc = service.create_lora_training_client(base_model=NAME, rank=args.rank, seed=0, train_unembed=False).result()
    tok = tc.get_tokenizer()
    prompts = PromptSampler(ArithmeticTask().train_rows(seed=0), seed=0)  # baton train's, data.seed 0
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    steps = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        path = tc.save_weights_for_sampler(name=f"step{step}").result().path
        sampler = service.create_sampling_client(model_path=path).result()
        rows = prompts.next_batch(args.prompts)
        ids = [prompt_ids(tok, row["prompt"]) for row in rows]
        futures = [sampler.sample(types.ModelInput.from_ints(p), args.n,  # seeded: a rerun draws the same
                                  params.model_copy(update={"seed": (args.seed * args.steps + step) * args.prompts + i}))
                   for i, p in enumerate(ids)]
        data, rewards, n_tokens = [], [], 0
        groups = []
        for row, prompt, fut in zip(rows, ids, futures):
            seqs = fut.result().sequences
            r = torch.tensor([float(verify(tok.decode(s.tokens, skip_special_tokens=True), row["answer"]))
                              for s in seqs])
            rewards += r.tolist()
            n_tokens += sum(len(s.tokens) for s in seqs)
            adv, _ = grpo_advantages(scores=r, response_mask=torch.ones(len(r), 1), group_size=len(r))  # [n, 1]
            groups.append((prompt, seqs, adv[:, 0]))  # baton train's estimator, one group
        sampled_s = time.perf_counter() - t0
        for prompt, seqs, adv in groups:
            if not adv.abs().sum():
                continue  # all rewards equal: advantage 0 on every token
            for s, a in zip(seqs, adv.tolist()):
                toks = prompt + list(s.tokens)
                sampled = [0.0] * (len(prompt) - 1) + [1.0] * len(s.tokens)
                data.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]), loss_fn_inputs={
                    "target_tokens": np.array(toks[1:]),
                    "logprobs": np.array([0.0] * (len(prompt) - 1) + list(s.logprobs), np.float32),
                    "advantages": np.array([w * a / n_tokens for w in sampled], np.float32)}))
        if data:
            tc.forward_backward(data, "ppo", loss_fn_config=CLIP).result()
        tc.optim_step(types.AdamParams(learning_rate=lr_at(args, step), beta1=0.9, beta2=0.99, eps=1e-8,
                                       weight_decay=0.0, grad_clip_norm=1.0)).result()
        steps.append({"reward": sum(rewards) / len(rewards), "seconds": time.perf_counter() - t0,
                      "sample_s": sampled_s, "trained": len(data)})
        print(f"tinker step {step + 1}: reward {steps[-1]['reward']:.3f}  {steps[-1]['seconds']:.1f} s "
              f"({sampled_s:.1f} s saving and sampling)  {len(data)} sequences trained", flush=True)
    return steps


def baton_arm(args: argparse.Namespace, run: Path) -> list[dict]:
    """`baton train` of the recipe in this process; one {"reward", "seconds"} per step."""
    import torch

    from baton.cli import main as baton_main
    from baton.metrics import read_metrics
    from baton.tinker.trainee import LORA_ALPHA  # baton tinker's: the same adapters

    torch.set_num_threads(1)
    batch = args.prompts * args.n
    overrides = [f"model.path={DEMO_MODEL}", f"trainer.run_dir={run}", f"trainer.steps={args.steps}",
                 f"data.prompts_per_step={args.prompts}", f"rollout.n={args.n}",
                 f"rollout.max_new_tokens={args.max_tokens}", f"model.lora.rank={args.rank}",
                 f"model.lora.alpha={LORA_ALPHA}", f"actor.lr={args.lr}", f"actor.lr_warmup_steps={args.warmup}",
                 f"actor.mini_batch_size={batch}", f"actor.micro_batch_size={batch}", "data.eval_size=2",
                 "trainer.eval_every=0", "trainer.save_every=0", "trainer.progress=false", f"trainer.seed={args.seed}"]
    with contextlib.redirect_stdout(io.StringIO()):
        code = baton_main(["train", str(REPO / "recipes/grpo_arithmetic.yaml"), *overrides])
    if code:
        raise SystemExit(f"baton train exited {code}")
    steps = [{"reward": r["reward/mean"], "seconds": r["timing/step_s"] - r.get("timing/eval_s", 0.0)}
             for r in read_metrics(run) if r["step"] > 0 and "reward/mean" in r]
    for i, s in enumerate(steps):
        print(f"baton step {i + 1}: reward {s['reward']:.3f}  {s['seconds']:.1f} s", flush=True)
    return steps


def blocks(values: list[float], size: int) -> list[float]:
    return [round(statistics.fmean(values[i:i + size]), 3) for i in range(0, len(values), size)]


def report(results: dict[str, list[dict]], block: int) -> dict:
    """The side-by-side table, block means and the time ratio; also returned as a dict."""
    arms = list(results)
    print("\nstep " + "".join(f"{a:>10}" for a in arms))
    for i in range(max(len(v) for v in results.values())):
        print(f"{i + 1:>4} " + "".join(f"{results[a][i]['reward']:>10.3f}" if i < len(results[a]) else " " * 10
                                       for a in arms))
    out = {}
    for a in arms:
        rewards = [s["reward"] for s in results[a]]
        out[a] = {"rewards": [round(r, 4) for r in rewards], "block_means": blocks(rewards, block),
                  "median_step_s": round(statistics.median(s["seconds"] for s in results[a]), 3)}
        if "sample_s" in results[a][0]:
            out[a]["median_sample_s"] = round(statistics.median(s["sample_s"] for s in results[a]), 3)
        print(f"{a}: block means (of {block}) {out[a]['block_means']}, median {out[a]['median_step_s']} s/step"
              + (f" ({out[a]['median_sample_s']} s saving and sampling)" if "median_sample_s" in out[a] else ""))
    if {"tinker", "baton"} <= set(out) and out["baton"]["median_step_s"] > 0:
        out["time_ratio"] = round(out["tinker"]["median_step_s"] / out["baton"]["median_step_s"], 2)
        print(f"seconds per step, tinker / baton: {out['time_ratio']}")
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prompts", type=int, default=64, help="prompts per step (the recipe's)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (the group size)")
    p.add_argument("--lr", type=float, default=2e-3, help="3e-3 dipped, 1e-2 collapsed (baton arm, measured)")
    p.add_argument("--warmup", type=int, default=5, help="linear lr warm-up steps")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--block", type=int, default=5, help="steps per block mean")
    p.add_argument("--seed", type=int, default=0, help="the samples' seed (baton: trainer.seed; the prompts do not change)")
    p.add_argument("--arms", default="tinker,baton", help="which arms, in order: tinker, baton or both")
    p.add_argument("--work", type=Path, default=None, help="server log, state and run dir (default: a temp dir)")
    add_smoke(p)
    args = p.parse_args(argv)
    args.arms = args.arms.split(",")
    if set(args.arms) - {"tinker", "baton"} or len(set(args.arms)) != len(args.arms):
        p.error(f"--arms: tinker and/or baton, each once, got {','.join(args.arms)}")
    if min(args.steps, args.prompts, args.n, args.rank, args.max_tokens, args.block) < 1 or args.lr <= 0 \
            or min(args.warmup, args.seed) < 0:
        p.error("--steps, --prompts, --n, --rank, --max-tokens and --block must be >= 1, --lr > 0, --warmup and "
                "--seed >= 0")
    if args.smoke:
        args.steps, args.prompts, args.n, args.warmup, args.block = 2, 4, 4, 0, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="tinker-vs-baton-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"{args.steps} steps x {args.prompts} prompts x {args.n} samples, lr {args.lr} (warm-up {args.warmup}), "
          f"LoRA rank {args.rank}, max tokens {args.max_tokens}; work dir {work}", flush=True)
    results = {}
    for arm in args.arms:
        if arm == "tinker":
            server = Server(DEMO_MODEL, work / "state", work / "server.log", name=NAME, extra=("--threads", "1"))
            try:
                results[arm] = tinker_arm(args, server.url)
            finally:
                server.stop()
        else:
            results[arm] = baton_arm(args, work / "baton-run")
    out = report(results, args.block)
    (work / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **out},
                                                  indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
