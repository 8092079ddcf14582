"""Rollout throughput: EmbeddedEngine vs HF `model.generate`, side by side, on this machine.

For Qwen2-shaped models of ~0.75M, ~5M and ~25M parameters: 64 prompts (16..48 tokens,
left-padded) x 64 new tokens, sampling at temperature 1, EOS ignored so every method
produces exactly 64 x 64 tokens. Prints median tokens/s over --repeats runs, the speedup
over HF, and the fraction of the machine's measured matmul throughput the engine reaches
(needed FLOPs ~ 2 * params * tokens + attention, see `engine_flops`; a torch matmul of the
model's decode shape [rows, hidden] @ [hidden, intermediate] gives the machine's GFLOP/s).
"HF generate (GFLOP/s)" applies the same FLOP count to HF's time.

    .venv/bin/python bench/engine_throughput.py [--threads 1] [--repeats 3] [--sizes 0.75m,5m,25m]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import GenerationConfig

from baton.models import build_tiny_model
from baton.rollout.engine import EmbeddedEngine
from baton.rollout.protocol import SamplingParams
from _common import add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

# name -> tiny_config overrides (Qwen2 family, tied embeddings as in the presets)
SIZES = {
    "0.75m": dict(hidden=128, layers=3, heads=4, kv_heads=2, intermediate=384, vocab_size=1024),
    "5m": dict(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=1024, vocab_size=4096),
    "25m": dict(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536, vocab_size=2048),
}
N_PROMPTS, NEW_TOKENS = 64, 64


def build(name: str) -> torch.nn.Module:
    kw = dict(SIZES[name])
    vocab = kw.pop("vocab_size")
    # no EOS in the config, so HF generate never stops early either
    return build_tiny_model(None, vocab_size=vocab, eos_token_id=None, max_position=512, **kw).eval()


def make_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 49, (N_PROMPTS,), generator=g).tolist()
    return [torch.randint(4, vocab, (n,), generator=g).tolist() for n in lengths]


def run_hf(model, prompts: list[list[int]]) -> int:
    P = max(map(len, prompts))
    ids = torch.zeros(len(prompts), P, dtype=torch.long)  # [B, P] left-padded
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS,
                           min_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, generation_config=cfg)
    return (out.shape[1] - P) * len(prompts)


def run_engine(engine: EmbeddedEngine, prompts: list[list[int]]) -> int:
    params = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    return sum(len(c.token_ids) for c in engine.generate(prompts, params))


def timed(fns: dict, repeats: int) -> dict[str, tuple[float, int]]:
    """Median seconds and token count per method; the methods take turns in every round,
    so load from other processes on a shared machine hits them alike."""
    for fn in fns.values():
        fn()  # warm-up (allocator, lazy init)
    times: dict[str, list[float]] = {k: [] for k in fns}
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(times[k]), tokens[k]) for k in fns}


def matmul_gflops(m: int, k: int, n: int, repeats: int = 30) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * m * k * n / statistics.median(times) / 1e9


def engine_flops(model, prompts: list[list[int]]) -> float:
    """The work any engine must do: every prompt token through the layers (2 * layer
    params), every generated token through the layers and the LM head, plus QK^T and PV
    over the context. Embedding lookups are free; padding and extra logits are not counted."""
    cfg = model.config
    lm_head = model.lm_head.weight.numel()
    layer_params = sum(p.numel() for p in model.model.layers.parameters() if p.dim() == 2)
    q_dim = cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    flops = 0.0
    for p in prompts:
        L = len(p)
        flops += 2 * layer_params * L + 2 * (layer_params + lm_head) * NEW_TOKENS
        ctx = L * (L + 1) / 2 + sum(L + t for t in range(NEW_TOKENS))  # keys seen, summed over queries
        flops += 4 * cfg.num_hidden_layers * q_dim * ctx
    return flops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1, help="2 is unreliable while other jobs share the cores")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="0.75m,5m,25m")
    ap.add_argument("--no-hf-runner", action="store_true", help="skip the engine's generic HF path")
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.repeats, args.sizes, args.no_hf_runner = 1, "0.75m", True
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"threads={args.threads} repeats={args.repeats} prompts={N_PROMPTS} new_tokens={NEW_TOKENS} "
          f"(medians; the machine may be shared, see the report)")
    header = (f"{'model':>6} {'params':>7} | {'HF generate':>11} {'engine/HF path':>14} {'engine fast':>11} | "
              f"{'speedup':>7} | {'HF GFLOP/s':>10} {'engine GFLOP/s':>14} {'matmul GFLOP/s':>14} "
              f"{'fraction':>8} | {'ceiling':>7}")
    print(header)
    print("-" * len(header))
    for name in args.sizes.split(","):
        model = build(name)
        prompts = make_prompts(model.config.vocab_size)
        n_params = sum(p.numel() for p in model.parameters())
        fast = EmbeddedEngine(model)
        fns = {"hf": lambda: run_hf(model, prompts), "fast": lambda: run_engine(fast, prompts)}
        if not args.no_hf_runner:
            slow = EmbeddedEngine(model, fast=False)
            fns["slow"] = lambda: run_engine(slow, prompts)
        res = timed(fns, args.repeats)
        (t_hf, tok_hf), (t_fast, tok_fast) = res["hf"], res["fast"]
        hf_path = f"{res['slow'][1] / res['slow'][0]:.0f}" if "slow" in res else "-"
        assert tok_hf == tok_fast == N_PROMPTS * NEW_TOKENS, (tok_hf, tok_fast)
        flops = engine_flops(model, prompts)
        engine_gflops, hf_gflops = flops / t_fast / 1e9, flops / t_hf / 1e9
        peak = matmul_gflops(N_PROMPTS, model.config.hidden_size, model.config.intermediate_size)
        # ceiling: the speedup over HF of an engine that ran all its FLOPs at matmul speed
        print(f"{name:>6} {n_params / 1e6:6.2f}M | {tok_hf / t_hf:9.0f}/s {hf_path:>12}/s {tok_fast / t_fast:9.0f}/s | "
              f"{t_hf / t_fast:6.2f}x | {hf_gflops:10.1f} {engine_gflops:14.1f} {peak:14.1f} "
              f"{engine_gflops / peak:8.0%} | {peak / hf_gflops:6.2f}x")
    big = matmul_gflops(512, 1024, 1024)
    print(f"(reference: a 512x1024 @ 1024x1024 fp32 matmul runs at {big:.1f} GFLOP/s on {args.threads} threads)")


if __name__ == "__main__":
    main()
