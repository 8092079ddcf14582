"""Benchmark: on-policy distillation next to GRPO and next to SFT on the teacher's samples,
from the same warm start, side by side in one run.

    .venv/bin/python bench/distill_vs_grpo.py [--distill-steps 50 --grpo-steps 300 --sft-steps 120
                                               --eval-every 10 --grpo-eval-every 30 --target 0.85
                                               --out runs/distill_vs_grpo]
    .venv/bin/python bench/distill_vs_grpo.py --smoke

Every arm starts from `checkpoints/arith-sft` (held-out greedy 0.475) and is evaluated on the
same 200 held-out prompts (greedy, and sampled at T=1 with 4 samples each):

    distill  recipes/distill_arithmetic.yaml: the student samples, checkpoints/arith-grpo gives
             its whole next-token distribution at every sampled position, the exact reverse KL
             to it is the loss (algo.distill_loss=reverse_kl; 64 prompts x 8 a step)
    sampled  the recipe as first shipped (algo.distill_loss=advantage, one pass of 4 optimizer
             steps of 128 rows): the sampled token's log ratio log p_teacher - log p_student as
             the advantage (the one-sample estimate)
    grpo     recipes/grpo_arithmetic.yaml: the demo that made the teacher (64 prompts x 8 a step)
    sft      off-policy distillation: baton's SFT driver on the teacher's own samples (T=1, one per
             training prompt, truncated ones dropped), `--sft-batch` rows an optimizer step
    small    a smaller student: the `0.2m` preset (0.21M parameters, the same tokenizer),
             warm-started as checkpoints/arith-sft was (recipes/sft_arithmetic.yaml, its 180
             steps), then distilled from the same 0.82M teacher by the distill recipe

The arms run one after the other in this process (`baton.cli.main`, one torch thread, each
recipe's placement as written: one process). Reported per
arm: the held-out accuracy at each evaluated step, the first step at which greedy accuracy
reaches `--target`, and training seconds (the steps' time without their evaluations). On a
shared machine compare seconds only as ratios between arms of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _common import SMOKE_TRAIN, add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

REPO = Path(__file__).resolve().parent.parent
STUDENT, TEACHER = REPO / "checkpoints" / "arith-sft", REPO / "checkpoints" / "arith-grpo"
SMOKE_SFT = ["data.eval_size=2", "data.eval_samples=1", "trainer.batch_size=4"]


def baton(args: list[str]) -> float:
    """Run `baton ARGS` in this process (one torch thread, the recipe's placement as written:
    one process, as each arm's recipe runs on this machine); its wall seconds."""
    import contextlib
    import io

    import torch

    from baton.cli import main as baton_main

    os.environ["BATON_PLACEMENT_AUTO"] = "0"
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = baton_main(args)
    if code:
        raise SystemExit(f"baton {' '.join(args)} exited {code}")
    return time.perf_counter() - t0


def curve(run_dir: Path) -> dict:
    """{evals: [(step, greedy, sampled, training seconds so far)], train_s, step_s}."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    spent, evals, steps = 0.0, [], []
    for r in rows:
        if r["step"] > 0 and "timing/step_s" in r:
            steps.append(r["timing/step_s"] - r.get("timing/eval_s", 0.0))
            spent += steps[-1]
        if "eval/accuracy_greedy" in r:
            evals.append((r["step"], r["eval/accuracy_greedy"], r["eval/accuracy_sampled"], spent))
    return {"evals": evals, "train_s": spent, "step_s": sorted(steps)[len(steps) // 2] if steps else 0.0}


def first_reaching(evals: list[tuple], target: float) -> tuple[int, float] | None:
    return next(((s, t) for s, g, _, t in evals if g >= target), None)


def rl_arm(recipe: str, run_dir: Path, steps: int, eval_every: int, smoke: bool, extra: list[str]) -> dict:
    wall = baton(["train", str(REPO / recipe), f"trainer.steps={steps}", f"trainer.eval_every={eval_every}",
                  f"trainer.run_dir={run_dir}", "trainer.overwrite=true", "trainer.progress=false",
                  "placement.threads_per_worker=1", *(SMOKE_TRAIN if smoke else []), *extra])
    return {**curve(run_dir), "wall_s": wall}


def teacher_samples(out: Path, n_rows: int, eval_size: int, seed: int = 0) -> tuple[Path, Path, dict]:
    """The teacher's own completions of `n_rows` training prompts (T=1, one each; those cut
    off by the token limit dropped) as SFT rows with a `target`, and the task's held-out rows
    (the RL arms' evaluation set) as the eval file."""
    import torch

    from baton.data.records import render_prompt
    from baton.envs import get_task
    from baton.models import load_model, load_tokenizer
    from baton.protocol import SamplingParams
    from baton.rollout.embedded.engine import EmbeddedEngine

    torch.set_num_threads(1)
    task = get_task("arithmetic")
    rows = task.train_rows(n_rows, seed=seed)
    tok = load_tokenizer(TEACHER)
    engine = EmbeddedEngine(load_model(TEACHER).eval(), tok)
    prompts = [tok(render_prompt(tok, r["prompt"]), add_special_tokens=False)["input_ids"] for r in rows]
    done = engine.generate(prompts, SamplingParams(n=1, temperature=1.0, max_new_tokens=4, seed=seed))
    texts = tok.batch_decode([c.token_ids for c in done], skip_special_tokens=True)
    kept = [{**rows[c.prompt_index], "target": text} for c, text in zip(done, texts) if c.finish_reason == "stop"]
    correct = sum(task.is_correct(r["target"], r) for r in kept)
    out.mkdir(parents=True, exist_ok=True)
    train, held = out / "teacher_samples.jsonl", out / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in kept))
    held.write_text("".join(json.dumps(r) + "\n" for r in task.eval_rows(eval_size)))
    return train, held, {"samples": len(kept), "correct": correct / max(1, len(kept))}


def sft_arm(run_dir: Path, a: argparse.Namespace) -> dict:
    rows = a.sft_steps * a.sft_batch
    train, held, stats = teacher_samples(run_dir.parent / "sft_data", rows, 2 if a.smoke else 200)
    wall = baton(["train", str(REPO / "recipes/sft_arithmetic.yaml"), f"model.path={STUDENT}",
                  f"data.path={train}", f"data.eval_path={held}", f"data.num_examples={rows}",
                  f"trainer.steps={a.sft_steps}", f"trainer.batch_size={a.sft_batch}", f"trainer.eval_every={a.eval_every}",
                  f"optim.lr={a.sft_lr}", "optim.lr_warmup_steps=5", f"trainer.run_dir={run_dir}",
                  "trainer.overwrite=true", "trainer.progress=false", *(SMOKE_SFT if a.smoke else [])])
    return {**curve(run_dir), "wall_s": wall, "teacher_samples": stats}


def small_arm(run_dir: Path, a: argparse.Namespace) -> dict:
    """The smaller student: SFT warm start of the 0.2m preset, then the distill recipe from it."""
    warm = run_dir.parent / "small_sft"
    baton(["train", str(REPO / "recipes/sft_arithmetic.yaml"), "model.preset=0.2m", f"trainer.run_dir={warm}",
           "trainer.overwrite=true", "trainer.progress=false", *(SMOKE_SFT + ["trainer.steps=2"] if a.smoke else [])])
    student = max((warm / "checkpoints").iterdir(), key=lambda d: int(d.name.split("_")[-1]))
    return {**rl_arm("recipes/distill_arithmetic.yaml", run_dir, a.distill_steps, a.eval_every, a.smoke,
                     [f"model.path={student}", *a.distill]), "student": str(student)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--distill-steps", type=int, default=50)
    p.add_argument("--grpo-steps", type=int, default=300)
    p.add_argument("--sft-steps", type=int, default=120)
    p.add_argument("--sft-batch", type=int, default=128, help="rows an SFT optimizer step (RL: 4 x 128 a step)")
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--grpo-eval-every", type=int, default=30)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--arms", default="distill,grpo,sft,small")
    p.add_argument("--out", default="", help="run dirs and results.json (default runs/distill_vs_grpo; smoke: a temp dir)")
    p.add_argument("--distill", nargs="*", default=[], help="extra overrides for the distillation arm")
    add_smoke(p)
    a = p.parse_args()
    if a.smoke:
        a.distill_steps = a.grpo_steps = a.sft_steps = 2
        a.eval_every = a.grpo_eval_every = 0
        a.sft_batch = 4
    out = Path(a.out or (tempfile.mkdtemp(prefix="distill-smoke-") if a.smoke else "runs/distill_vs_grpo"))
    arms = a.arms.split(",")
    results = {}
    for arm in arms:
        if arm == "distill":
            results[arm] = rl_arm("recipes/distill_arithmetic.yaml", out / arm, a.distill_steps, a.eval_every,
                                  a.smoke, a.distill)
        elif arm == "sampled":
            results[arm] = rl_arm("recipes/distill_arithmetic.yaml", out / arm, a.distill_steps, a.eval_every,
                                  a.smoke, ["algo.distill_loss=advantage", "actor.epochs=1", "actor.mini_batch_size=128",
                                   "actor.micro_batch_size=128", *a.distill])
        elif arm == "small":
            results[arm] = small_arm(out / arm, a)
        elif arm == "grpo":
            results[arm] = rl_arm("recipes/grpo_arithmetic.yaml", out / arm, a.grpo_steps, a.grpo_eval_every,
                                  a.smoke, [])
        elif arm == "sft":
            results[arm] = sft_arm(out / arm, a)
        else:
            raise SystemExit(f"unknown arm {arm!r}: distill, sampled, small, grpo, sft")
    print(f"held-out greedy / sampled accuracy (200 prompts), first step at greedy >= {a.target}, training s")
    for arm, r in results.items():
        reach = first_reaching(r["evals"], a.target)
        where = f"step {reach[0]} after {reach[1]:.0f} s" if reach else "not reached"
        print(f"{arm:8s} median step {r['step_s']:.2f} s, {r['train_s']:.0f} s training, {r['wall_s']:.0f} s wall; "
              f">= {a.target}: {where}")
        print("         " + " ".join(f"{s}:{g:.3f}/{sm:.3f}@{t:.0f}" for s, g, sm, t in r["evals"]))
        if "teacher_samples" in r:
            print(f"         teacher samples: {r['teacher_samples']}")
    (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
