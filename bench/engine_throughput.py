"""Rollout throughput: EmbeddedEngine vs HF `model.generate`, side by side, on this machine.

Qwen2-shaped models with random weights (EOS ignored, so every method produces exactly
prompts x new tokens): ~0.75M / 5M / 25M parameters for a CPU (64 prompts of 16..48 tokens,
left-padded, x 64 new tokens), the Qwen2.5-0.5B / 1.5B shapes for a GPU (issue 28's case:
`--device cuda --dtype bfloat16 --sizes 0.5b --prompts 128 --new-tokens 256`). Sampling at
temperature 1. Prints each run's rate as it is measured, then median tokens/s over --repeats
runs (HF generate's once with --hf-once) of: HF generate; the engine as
configured by default on that device ("engine"); and its other decode path ("other": on a
CPU static decode forced on, on a GPU static decode off - the eager path, a kernel launch
per op per token). Then the speedups over HF, and how far the engine is from its limit:

  * CPU: the fraction of the machine's measured matmul throughput the engine reaches (needed
    FLOPs ~ 2 * params * tokens + attention, `engine_flops`; a torch matmul of the decode
    shape [rows, hidden] @ [hidden, intermediate] gives the machine's GFLOP/s);
  * GPU: the fraction of the decode limit: each step needs at least max(bytes read / memory
    bandwidth, FLOPs / peak) (the weights once per step plus the KV cache; `decode_limit_s`),
    with the peak figures of GPU_PEAKS for the card the name matches (H100 SXM: 3.35 TB/s,
    989 TFLOP/s dense bf16; H200: 4.8 TB/s, 989 TFLOP/s; fp32 without TF32: 67 TFLOP/s).

With --ref REV, one more method: the engine with the fast runner (`llama.py`) as it is at
git revision REV ("engine@REV"), taking turns with the others: before / after in one run.

    .venv/bin/python bench/engine_throughput.py [--threads 1] [--repeats 3] [--sizes 0.75m,5m,25m] [--ref main]
    python bench/engine_throughput.py --device cuda --dtype bfloat16 --sizes 0.5b --prompts 128 --new-tokens 256
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
from transformers import GenerationConfig

from baton.models import build_tiny_model
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from _common import add_smoke, module_at  # bench/_common.py (scripts run from bench/ on sys.path)

# name -> tiny_config overrides (Qwen2 family, tied embeddings as in the presets)
SIZES = {
    "0.75m": dict(hidden=128, layers=3, heads=4, kv_heads=2, intermediate=384, vocab_size=1024),
    "5m": dict(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=1024, vocab_size=4096),
    "25m": dict(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536, vocab_size=2048),
    # the public Qwen2.5 configs' shapes (random weights)
    "0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab_size=151936),
    "1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab_size=151936),
    # a mixture of experts (issue 54): Qwen3-MoE, 8 experts of 256, top-2 (the fast path's `moe.py`)
    "moe-5m": dict(family="qwen3_moe", hidden=256, layers=4, heads=8, kv_heads=4, intermediate=256, experts=8,
                   top_k=2, vocab_size=4096),
}
# name -> (memory bytes/s, {dtype: dense FLOP/s}) from the vendors' data sheets (SXM parts)
GPU_PEAKS = {
    "H200": (4.8e12, {torch.bfloat16: 989e12, torch.float32: 67e12}),
    "H100": (3.35e12, {torch.bfloat16: 989e12, torch.float32: 67e12}),
}


def build(name: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    kw = dict(SIZES[name])
    vocab = kw.pop("vocab_size")
    with torch.device(device):  # a 0.5B model initialises in a blink on the GPU
        # no EOS in the config, so HF generate never stops early either
        model = build_tiny_model(None, vocab_size=vocab, eos_token_id=None, max_position=4096, **kw)
    return model.to(dtype).eval()


def make_prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 49, (n,), generator=g).tolist()
    return [torch.randint(4, vocab, (k,), generator=g).tolist() for k in lengths]


def run_hf(model, prompts: list[list[int]], new: int) -> int:
    P = max(map(len, prompts))
    ids = torch.zeros(len(prompts), P, dtype=torch.long)  # [B, P] left-padded
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                           min_new_tokens=new, pad_token_id=0, eos_token_id=None)
    device = model.device
    with torch.inference_mode():
        out = model.generate(ids.to(device), attention_mask=mask.to(device), generation_config=cfg)
    return (out.shape[1] - P) * len(prompts)


def run_engine(engine: EmbeddedEngine, prompts: list[list[int]], new: int) -> int:
    params = SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True)
    return sum(len(c.token_ids) for c in engine.generate(prompts, params))


def timed(fns: dict, repeats: int, device: str, once: dict | None = None) -> dict[str, tuple[float, int]]:
    """Median seconds and token count per method; the methods take turns in every round,
    so load from other processes on a shared machine hits them alike. `once`: methods timed
    in the first round only, each warmed up by its light call given there (HF generate's
    baseline: one run of it costs what a GPU check cannot spend three times). Each run's
    rate is printed as it is measured (a step killed at its limit still shows what ran)."""
    once = once or {}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for name, fn in fns.items():
        once.get(name, fn)()  # warm-up (allocator, lazy init)
    times: dict[str, list[float]] = {k: [] for k in fns}
    tokens: dict[str, int] = {}
    for round_ in range(repeats):
        for name, fn in fns.items():
            if round_ and name in once:
                continue
            sync()
            t0 = time.perf_counter()
            tokens[name] = fn()
            sync()
            times[name].append(time.perf_counter() - t0)
            print(f"  {name} run {round_ + 1}: {tokens[name] / times[name][-1]:.0f} tokens/s "
                  f"({times[name][-1]:.2f} s)", flush=True)
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


def _head_dim(model) -> int:
    return model.model.layers[0].self_attn.head_dim


def _shape(model) -> tuple[int, int, int]:
    """(2-D layer params, LM head params, query width) of a Llama / Qwen2 model."""
    layer_params = sum(p.numel() for p in model.model.layers.parameters() if p.dim() == 2)
    return layer_params, model.lm_head.weight.numel(), model.config.num_attention_heads * _head_dim(model)


def engine_flops(model, prompts: list[list[int]], new: int) -> float:
    """The work any engine must do: every prompt token through the layers (2 * layer
    params), every generated token through the layers and the LM head, plus QK^T and PV
    over the context. Embedding lookups are free; padding and extra logits are not counted."""
    layer_params, lm_head, q_dim = _shape(model)
    flops = 0.0
    for p in prompts:
        L = len(p)
        flops += 2 * layer_params * L + 2 * (layer_params + lm_head) * new
        ctx = L * (L + 1) / 2 + sum(L + t for t in range(new))  # keys seen, summed over queries
        flops += 4 * model.config.num_hidden_layers * q_dim * ctx
    return flops


def decode_limit_s(model, prompts: list[list[int]], new: int, bandwidth: float, peak: float) -> float:
    """The least time any engine needs on a GPU: the prefill at peak FLOP/s, then per decode
    step the longer of reading the weights (once, all rows share them) plus the KV cache
    at `bandwidth`, and its FLOPs at `peak`."""
    cfg, elt = model.config, next(model.parameters()).element_size()
    layer_params, lm_head, q_dim = _shape(model)
    kv_bytes = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * _head_dim(model) * elt  # per cached token
    prompt_tokens = sum(map(len, prompts))
    seconds = sum(2 * layer_params * len(p) + 2 * model.config.num_hidden_layers * q_dim * len(p) ** 2
                  for p in prompts) / peak
    for t in range(new):
        context = prompt_tokens + t * len(prompts)  # tokens in the cache, all rows
        read = (layer_params + lm_head) * elt + kv_bytes * context
        flops = 2 * (layer_params + lm_head) * len(prompts) + 4 * cfg.num_hidden_layers * q_dim * context
        seconds += max(read / bandwidth, flops / peak)
    return seconds


def gpu_peaks(dtype: torch.dtype) -> tuple[str, float, float]:
    """(card, memory bytes/s, dense FLOP/s at dtype) of GPU_PEAKS for this GPU; H100's if unknown."""
    name = torch.cuda.get_device_name()
    card = next((k for k in GPU_PEAKS if k in name), None)
    bandwidth, flops = GPU_PEAKS[card or "H100"]
    return (card or f"{name} (H100 figures assumed)"), bandwidth, flops[dtype]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1, help="2 is unreliable while other jobs share the cores")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="0.75m,5m,25m", help=f"of {sorted(SIZES)}")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--no-hf-runner", action="store_true", help="skip the engine's generic HF path")
    ap.add_argument("--ref", default=None, help="also time the engine with llama.py at this git revision")
    ap.add_argument("--hf-once", action="store_true",
                    help="time HF generate in one run (warmed up by a short call), not --repeats")
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.repeats, args.sizes, args.no_hf_runner, args.prompts, args.new_tokens = 1, "0.75m", True, 16, 16
        args.hf_once = True
    dtype, gpu = getattr(torch, args.dtype), args.device == "cuda"
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    limit = gpu_peaks(dtype) if gpu else None
    print(f"device={args.device} dtype={args.dtype} threads={args.threads} repeats={args.repeats} "
          f"prompts={args.prompts} new_tokens={args.new_tokens} (medians; the machine may be shared)")
    other_name = "static off" if gpu else "static on"
    header = (f"{'model':>6} {'params':>8} | {'HF generate':>11} {'engine':>9} {other_name:>11} "
              f"{'engine/HF path':>14} | {'speedup':>7} {'other':>6} | "
              + (f"{'limit tok/s':>11} {'fraction':>8}" if gpu else
                 f"{'engine GFLOP/s':>14} {'matmul GFLOP/s':>14} {'fraction':>8} | {'ceiling':>7}"))
    print(header)
    print("-" * len(header))
    summaries = []
    for name in args.sizes.split(","):
        model = build(name, args.device, dtype)
        prompts = make_prompts(model.config.vocab_size, args.prompts)
        n_params = sum(p.numel() for p in model.parameters())
        engine, other = EmbeddedEngine(model), EmbeddedEngine(model, static_decode=not gpu)
        new = args.new_tokens
        fns = {"hf": partial(run_hf, model, prompts, new), "engine": partial(run_engine, engine, prompts, new),
               "other": partial(run_engine, other, prompts, new)}
        if args.ref:
            at_ref = EmbeddedEngine(model)
            at_ref.runner = module_at(args.ref, "baton/rollout/embedded/llama.py", "llama_at_ref").LlamaRunner(model)
            fns["ref"] = partial(run_engine, at_ref, prompts, new)
        if not args.no_hf_runner:
            fns["slow"] = partial(run_engine, EmbeddedEngine(model, fast=False), prompts, new)
        once = {"hf": partial(run_hf, model, prompts[:2], 4)} if args.hf_once else None
        res = timed(fns, args.repeats, args.device, once)
        assert {tokens for _, tokens in res.values()} == {args.prompts * new}, res
        rate = {k: tokens / t for k, (t, tokens) in res.items()}
        slow = f"{rate['slow']:.0f}/s" if "slow" in rate else "-"
        row = (f"{name:>6} {n_params / 1e6:7.2f}M | {rate['hf']:9.0f}/s {rate['engine']:7.0f}/s "
               f"{rate['other']:9.0f}/s {slow:>14} | {rate['engine'] / rate['hf']:6.2f}x "
               f"{rate['other'] / rate['hf']:5.2f}x | ")
        fraction = ""
        if gpu:
            best = decode_limit_s(model, prompts, new, limit[1], limit[2])
            share = best / res["engine"][0]  # the limit's time over the engine's
            fraction = f", {share:.1%} of the decode limit"
            print(row + f"{args.prompts * new / best:11.0f} {share:8.1%}")
        else:
            flops = engine_flops(model, prompts, new)
            t_hf, t_engine = res["hf"][0], res["engine"][0]
            peak = matmul_gflops(args.prompts, model.config.hidden_size, model.config.intermediate_size)
            # ceiling: the speedup over HF of an engine that ran all its FLOPs at matmul speed
            print(row + f"{flops / t_engine / 1e9:14.1f} {peak:14.1f} {flops / t_engine / 1e9 / peak:8.0%} | "
                  f"{peak * 1e9 * t_hf / flops:6.2f}x")
        summaries.append(f"{name} {args.dtype} on {args.device}: engine {rate['engine']:.0f} tokens/s, HF generate "
                         f"{rate['hf']:.0f} tokens/s{fraction}: {rate['engine'] / rate['hf']:.2f}x")
        if "ref" in rate:
            summaries.append(f"{name}: engine with llama.py at {args.ref} {rate['ref']:.0f} tokens/s; this tree's "
                             f"{rate['engine']:.0f} tokens/s: {rate['engine'] / rate['ref']:.2f}x")
        del model, engine, other, fns
    if gpu:
        print(f"(decode limit: {limit[0]}, {limit[1] / 1e12:.2f} TB/s, {limit[2] / 1e12:.0f} TFLOP/s dense "
              f"{args.dtype}; peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB)")
    else:
        big = matmul_gflops(512, 1024, 1024)
        print(f"(reference: a 512x1024 @ 1024x1024 fp32 matmul runs at {big:.1f} GFLOP/s on {args.threads} threads)")
    print("\n".join(summaries))


if __name__ == "__main__":
    main()
