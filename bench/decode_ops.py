"""Kernels a decode token: the fast runner's decode step today vs at a git ref, side by side.

Counts, with `baton.rollout.embedded.op_count` (a dispatch recorder; views left out; RMSNorm counted
as the one CUDA kernel it is on a GPU), the aten ops of one static decode step (the step a
CUDA graph captures) at the Qwen2.5-0.5B shape (24 layers, hidden 896, 14 heads, 2 KV
heads, intermediate 4864; vocab 1024, as the count does not depend on it), per family, for
this tree's `llama.py` and for --ref's (a family that --ref's runner does not take: HF's
forward of one cached token, which that ref ran every token). Then, in fp32 on a tiny
model of each family --ref supports, whether the two give the same tokens for the same seed
and the largest logprob difference.

    .venv/bin/python bench/decode_ops.py [--ref main] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse

import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config)

from baton.rollout.embedded.llama import LlamaRunner, fuse_storage, supports
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.embedded.op_count import count_kernels
from baton.protocol import SamplingParams
from baton.rollout.embedded.static_decode import StaticDecoder
from _common import add_smoke, module_at

SHAPE_05B = dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864)
CONFIGS = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3": Qwen3Config, "mistral": MistralConfig}


def build(family: str, layers: int, dtype: torch.dtype, shape: dict, vocab: int) -> torch.nn.Module:
    cfg = CONFIGS[family](vocab_size=vocab, num_hidden_layers=layers, initializer_range=0.3, **shape)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).to(dtype).eval()


def runner_ops(runner_cls, model, rows: int = 4, **options) -> int:
    """Kernels of one static decode step of `runner_cls` after a prefill of `rows` prompts."""
    runner = runner_cls(model, **options)
    runner.pack()
    with torch.no_grad():
        ids = torch.randint(4, model.config.vocab_size, (rows, 8))
        runner.start(ids, torch.ones_like(ids), 8, 1)
        step = StaticDecoder(runner, rows, step="fixed").step
        return sum(count_kernels(step)[1].values())


def hf_ops(model, rows: int = 4) -> int:
    """Kernels of HF's forward of one token per row after a cached 8-token prompt."""
    with torch.no_grad():
        ids = torch.randint(4, model.config.vocab_size, (rows, 8))
        past = model(ids, use_cache=True).past_key_values
        tok = torch.randint(4, model.config.vocab_size, (rows, 1))
        return sum(count_kernels(lambda: model(tok, past_key_values=past, use_cache=True))[1].values())


def parity(old_cls, model) -> tuple[bool, float]:
    """(same tokens, largest |logprob difference|) of the engine with this tree's runner and
    with old_cls, fp32, sampled (n=3, temperature 0.7, seed 0) and with static decode."""
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [40]]
    same, worst = True, 0.0
    for static in (False, "fixed"):
        for params in (SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=0),
                       SamplingParams(n=3, temperature=1.0, max_new_tokens=24, seed=1,
                                      stop_token_ids=list(range(100, 130)))):
            new_engine, old_engine = EmbeddedEngine(model, static_decode=static), EmbeddedEngine(model, static_decode=static)
            old_engine.runner = old_cls(model)
            new, old = new_engine.generate(prompts, params), old_engine.generate(prompts, params)
            same &= [c.token_ids for c in new] == [c.token_ids for c in old]
            for a, b in zip(new, old):
                if a.token_ids == b.token_ids and a.logprobs:
                    worst = max(worst, (torch.tensor(a.logprobs) - torch.tensor(b.logprobs)).abs().max().item())
    return same, worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default="main", help="the git revision to compare with (--smoke: HEAD)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--families", default="qwen2,llama,qwen3,mistral")
    add_smoke(ap)
    args = ap.parse_args()
    shape = SHAPE_05B
    if args.smoke:  # the count does not depend on the sizes; only the head counts are kept
        args.layers, shape = 2, dict(SHAPE_05B, hidden_size=56, intermediate_size=64)
        args.ref = "HEAD"  # a CI clone may have no `main`
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    old = module_at(args.ref, "baton/rollout/embedded/llama.py", "llama_at_ref")
    print(f"kernels per decode token, static decode step, {args.layers} layers, {args.dtype}, 4 rows")
    print(f"{'family':>8} | {args.ref + ' (ops)':>16} {'per layer':>9} | {'this tree':>9} {'per layer':>9}")
    for family in args.families.split(","):
        counts = []
        for layers in (1, args.layers):
            model = build(family, layers, dtype, shape, vocab=1024)
            assert supports(model), family
            ref = runner_ops(old.LlamaRunner, model) if old.supports(model) else hf_ops(model)
            counts.append((ref, runner_ops(LlamaRunner, model)))
            del model
        (r1, n1), (rl, nl) = counts
        per = lambda one, full: (full - one) / (args.layers - 1)  # noqa: E731
        how = "" if old.supports(build(family, 1, dtype, shape, 1024)) else " (HF)"
        print(f"{family:>8} | {str(rl) + how:>16} {per(r1, rl):9.1f} | {nl:9d} {per(n1, nl):9.1f}")
    # the rollout worker's own copy is read in place (fuse_weights=False): Q/K/V, gate/up apart,
    # then laid out back to back by fuse_storage
    model = build("qwen2", args.layers, dtype, shape, vocab=1024)
    apart = runner_ops(LlamaRunner, model, fuse=False)
    fuse_storage(model)
    print(f"qwen2, fuse_weights=False (an own copy read in place): {apart} with Q/K/V and gate/up apart, "
          f"{runner_ops(LlamaRunner, model, fuse=False)} laid out by fuse_storage")
    print(f"\nfp32, tiny models: this tree vs {args.ref}, same seed (sampled, stop ids, static decode off/on)")
    tiny = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    for family in args.families.split(","):
        model = build(family, 2, torch.float32, tiny, vocab=260)
        if not old.supports(model):
            continue
        same, worst = parity(old.LlamaRunner, model)
        print(f"{family:>8}: same tokens {same}, largest logprob difference {worst:.2e}")


if __name__ == "__main__":
    main()
