"""Peak memory and time of the actor's logprob loss, plain (full logits) vs chunked
(`baton.algos.linear_logprobs`, the default path of `baton.workers.sequences`), on a random
model of the Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads, 2 KV heads, vocab 151936,
intermediate 4864, tied embeddings), one CPU thread.

    .venv/bin/python bench/chunked_logprobs.py [--rows 8 --prompt 32 --response 96] [--layers 24]
    .venv/bin/python bench/chunked_logprobs.py --smoke     # the 0.75m tiny shape, seconds
    .venv/bin/python bench/chunked_logprobs.py --tiny-timing  # which is faster at tiny shapes

One measured step = response_logprobs (with the entropy metric, as the actor's update asks)
of `rows` rows of prompt + response tokens, then backward of -sum(logprobs). Each path runs
in a fresh process: model built, then one step; reported are the time of that step and the
peak RSS during it above the RSS before it (gradients of every parameter included, the same
for both paths), sampled every 5 ms. Both paths' logprobs are compared (max abs difference).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import psutil  # noqa: E402
import torch  # noqa: E402

QWEN_05B = dict(preset=None, hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                vocab_size=151936, max_position=512)
SMOKE = dict(preset="0.75m", vocab_size=260)


class PeakRSS:
    def __init__(self, interval=0.005):
        self.proc, self.interval, self.peak, self.stop = psutil.Process(), interval, 0, False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.stop:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)


def batch_of(rows: int, prompt: int, response: int, vocab: int):
    from baton import fields as F
    from baton.batch import Batch

    g = torch.Generator().manual_seed(0)
    return Batch({F.PROMPT_IDS: torch.randint(3, vocab, (rows, prompt), generator=g),
                  F.PROMPT_MASK: torch.ones(rows, prompt, dtype=torch.long),
                  F.RESPONSE_IDS: torch.randint(3, vocab, (rows, response), generator=g),
                  F.RESPONSE_MASK: torch.ones(rows, response, dtype=torch.long)})


def step(model, batch, fused: bool) -> torch.Tensor:
    from baton.workers.sequences import response_logprobs

    model.zero_grad(set_to_none=True)
    logp, _ = response_logprobs(model, batch, temperature=0.7, with_entropy=True, fused=fused)
    (-logp.sum()).backward()
    return logp.detach()


def child(args) -> None:
    """One path in this process: build, measure one step, print a JSON line."""
    from baton.models.tiny import build_tiny_model

    shape = dict(SMOKE if args.smoke else QWEN_05B)
    if args.layers:
        shape["layers"] = args.layers
    t0 = time.perf_counter()
    model = build_tiny_model(seed=0, **shape).train()
    build_s = time.perf_counter() - t0
    batch = batch_of(args.rows, args.prompt, args.response, model.config.vocab_size)
    rss = PeakRSS()
    time.sleep(0.05)
    base = rss.proc.memory_info().rss
    rss.peak = base
    t0 = time.perf_counter()
    logp = step(model, batch, fused=args.path == "fused")
    seconds = time.perf_counter() - t0
    time.sleep(0.02)
    rss.stop = True
    torch.save(logp, args.out)
    print(json.dumps({"path": args.path, "step_s": round(seconds, 3), "build_s": round(build_s, 1),
                      "peak_above_start_mib": round((rss.peak - base) / 2**20),
                      "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1)}))


def tiny_timing(iters: int) -> None:
    """Median ms of a step at the unit tests' shapes (0.75m, vocab 260), both paths."""
    from baton.models.tiny import build_tiny_model
    sys.path.insert(0, os.path.dirname(__file__))
    from _timing import median_ms

    model = build_tiny_model(**SMOKE, seed=0).train()
    for rows, prompt, response in ((8, 8, 16), (32, 16, 32)):
        batch = batch_of(rows, prompt, response, 260)
        res = {p: median_ms(lambda: step(model, batch, p == "fused"), iters, warmup=3) for p in ("plain", "fused")}
        print(json.dumps({"rows": rows, "prompt": prompt, "response": response,
                          **{f"{k}_ms": round(v, 2) for k, v in res.items()}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the tiny 0.75m shape (seconds)")
    ap.add_argument("--tiny-timing", action="store_true", help="plain vs fused step time at tiny shapes")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=96)
    ap.add_argument("--layers", type=int, default=0, help="override the layer count (0: the shape's)")
    ap.add_argument("--path", choices=["plain", "fused"], help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.tiny_timing:
        return tiny_timing(args.iters)
    if args.path:
        return child(args)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, os.path.dirname(__file__))
        from _common import child_paths

        results = child_paths(__file__, ("plain", "fused"), tmp,
                              ["--rows", str(args.rows), "--prompt", str(args.prompt), "--response", str(args.response),
                               "--layers", str(args.layers)] + (["--smoke"] if args.smoke else []))
        diff = (torch.load(os.path.join(tmp, "plain.pt")) - torch.load(os.path.join(tmp, "fused.pt"))).abs().max()
        p, f = results["plain"], results["fused"]
        print(json.dumps({"rows": args.rows, "tokens_per_row": args.prompt + args.response,
                          "peak_mib": [p["peak_above_start_mib"], f["peak_above_start_mib"]],
                          "step_s": [p["step_s"], f["step_s"]], "max_abs_logprob_diff": diff.item(),
                          "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
