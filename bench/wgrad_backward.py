"""Time and peak memory of the chunked logprobs' backward (`baton.algos.linear_logprobs`)
under bf16 autocast with an fp32 weight (the actor's output projection on a GPU), the weight
gradient accumulated as before issue 43 (a bf16 [V, H] product, its fp32 copy and an add per
chunk) vs fused (`accumulate_wgrad`: in place into the fp32 buffer), at the Qwen2.5-0.5B
output projection (V = 151936, H = 896) and 4 chunks of 110 tokens, one CPU thread.

    .venv/bin/python bench/wgrad_backward.py [--tokens 440] [--vocab 151936 --hidden 896]
    .venv/bin/python bench/wgrad_backward.py --smoke     # V = 2000, H = 64: seconds

Each path runs in a fresh process: inputs built, the forward run, then the measured
backward; reported are its time and the peak RSS during it above the RSS before it (the
gradient buffers included, the same for both paths), sampled every 5 ms. The parent
compares the two weight gradients (max |a - b| over max |b|).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from _common import child_paths  # noqa: E402  (bench/ is on sys.path)
from chunked_logprobs import PeakRSS  # noqa: E402


def child(args) -> None:
    from baton.algos.linear_logprobs import linear_logprobs

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=g, requires_grad=True)
    weight = (torch.randn(args.vocab, args.hidden, generator=g) / args.hidden ** 0.5).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.tokens,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = linear_logprobs(hidden, weight, labels, 0.7, chunk_tokens=args.chunk,
                                  fused_wgrad=args.path == "fused")
    loss = -logp.sum()
    rss = PeakRSS()
    time.sleep(0.05)
    base = rss.proc.memory_info().rss
    rss.peak = base
    t0 = time.perf_counter()
    loss.backward()
    seconds = time.perf_counter() - t0
    time.sleep(0.02)
    rss.stop = True
    torch.save(weight.grad, args.out)
    print(json.dumps({"path": args.path, "backward_s": round(seconds, 3),
                      "peak_above_start_mib": round((rss.peak - base) / 2**20)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="V = 2000, H = 64, 40 tokens in chunks of 8 (seconds)")
    ap.add_argument("--tokens", type=int, default=440)
    ap.add_argument("--chunk", type=int, default=110)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--path", choices=["unfused", "fused"], help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.tokens, args.chunk, args.vocab, args.hidden = 40, 8, 2000, 64
    torch.set_num_threads(1)
    if args.path:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        res = child_paths(__file__, ("unfused", "fused"), tmp, ["--tokens", str(args.tokens), "--chunk", str(args.chunk),
                                                                "--vocab", str(args.vocab), "--hidden", str(args.hidden)])
        a, b = torch.load(os.path.join(tmp, "fused.pt")), torch.load(os.path.join(tmp, "unfused.pt"))
        rel = ((a - b).abs().max() / b.abs().max()).item()
    u, f = res["unfused"], res["fused"]
    print(json.dumps({"V": args.vocab, "H": args.hidden, "tokens": args.tokens, "chunk": args.chunk,
                      "backward_s": [u["backward_s"], f["backward_s"]],
                      "peak_mib": [u["peak_above_start_mib"], f["peak_above_start_mib"]],
                      "max_rel_grad_diff": rel, "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
