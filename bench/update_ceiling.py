"""Benchmark: how close a model's own forward + backward comes to the machine's matmul rate,
and what half the rows cost: the ceilings under baton's update on a CPU.

    .venv/bin/python bench/update_ceiling.py [--shape 5m --rows 64 --tokens 39 --repeats 5]

One thread, a random model of --shape (bench/_common.random_model_dir), rows x tokens of
random ids, the loss a token-mean of log-softmax at the next token (what a policy loss
computes), forward + backward, gradients freed after each (no optimizer step, no baton code:
plain transformers + torch). Printed, side by side in one run:
- eager at --rows, eager at --rows / 2, and (unless --no-compile) `torch.compile` (inductor,
  C++ kernels; its compile time printed apart) at --rows: seconds, and the share of the
  one-thread fp32 matmul rate that 6 x matmul params x tokens at that time is;
- half the rows' cost as a share of all of them: 1 / that share is the most data parallel
  over 2 processes can give this update when communication costs nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: _common, engine_throughput, grpo_vs_trl
from _common import add_smoke, random_model_dir  # noqa: E402
from _timing import median_ms  # noqa: E402


def timed(step, repeats: int) -> float:
    """Median seconds of step() over `repeats` calls, after 2 warm-up calls."""
    return median_ms(step, repeats, warmup=2) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="5m", choices=["0.75m", "2m", "5m", "25m"])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=39, help="tokens a row (the 5M GRPO step: ~7 prompt + ~32)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    add_smoke(ap)
    a = ap.parse_args()
    if a.smoke:
        a.shape, a.rows, a.tokens, a.repeats, a.no_compile = "0.75m", 4, 8, 1, True
    torch.set_num_threads(1)
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine_throughput import matmul_gflops
    from grpo_vs_trl import matmul_params

    with tempfile.TemporaryDirectory() as tmp:
        path = random_model_dir(a.shape, Path(tmp) / "model")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        conf = AutoConfig.from_pretrained(path)
        params = matmul_params(path)
    rate = matmul_gflops(min(2048, a.rows * a.tokens), conf.hidden_size, conf.intermediate_size) * 1e9
    ids = torch.randint(4, conf.vocab_size, (a.rows, a.tokens), generator=torch.Generator().manual_seed(0))

    def step(m, rows: int):
        def run():
            x = ids[:rows]
            logp = torch.log_softmax(m(input_ids=x).logits[:, :-1].float(), -1)
            (-logp.gather(-1, x[:, 1:, None]).mean()).backward()
            for p in m.parameters():
                p.grad = None
        return run

    res = {f"eager, {a.rows} rows": (timed(step(model, a.rows), a.repeats), a.rows),
           f"eager, {a.rows // 2} rows": (timed(step(model, a.rows // 2), a.repeats), a.rows // 2)}
    if not a.no_compile:
        t0 = time.perf_counter()
        compiled = torch.compile(model, dynamic=False)
        step(compiled, a.rows)()
        print(f"torch.compile: {time.perf_counter() - t0:.1f} s to compile", flush=True)
        res[f"compiled, {a.rows} rows"] = (timed(step(compiled, a.rows), a.repeats), a.rows)
    print(f"\n{a.shape} ({params / 1e6:.2f}M matmul params), {a.tokens} tokens a row, one thread, median of "
          f"{a.repeats}; one-thread fp32 matmul rate {rate / 1e9:.1f} GFLOP/s")
    print("| run | forward + backward (s) | GFLOP (6 x params x tokens) | share of the matmul rate |")
    print("|---|---|---|---|")
    for name, (sec, rows) in res.items():
        flops = 6 * params * rows * a.tokens
        print(f"| {name} | {sec:.3f} | {flops / 1e9:.1f} | {flops / sec / rate:.0%} |")
    full, half = res[f"eager, {a.rows} rows"][0], res[f"eager, {a.rows // 2} rows"][0]
    print(f"half the rows cost {half / full:.2f} of all of them: data parallel over 2 processes "
          f"can give this update at most {full / half:.2f}x")


if __name__ == "__main__":
    main()
