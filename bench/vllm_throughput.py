"""Rollout throughput: baton's embedded engine vs vLLM inside baton vs bare vLLM, same weights.

Qwen2 shapes of bench/engine_throughput.py (5M, 25M): 64 prompts (16..48 tokens) x 64 new
tokens, temperature 1, EOS ignored, so every method produces 64 x 64 tokens; `0.5b`: the
Qwen2.5-0.5B shape (random weights, 494M, vocab 151936), 16 prompts x 32 new tokens.

    embedded        EmbeddedEngine.generate (what rollout.engine=embedded runs)
    vllm in baton   VLLMEngine.generate: baton's protocol, a seeded request per sample,
                    behaviour logprobs (what rollout.engine=vllm runs)
    bare vllm       LLM.generate on the same vLLM instance: one request per prompt, no
                    seed, no logprobs (what a user of vLLM alone runs)
    bare, seeded    LLM.generate with baton's requests (a seed and logprobs each): the
                    cost of baton's layer alone is "vllm in baton" against this

Also the colocated weight sync into vLLM (`VLLMEngine.update_weights`: load + re-pack, fp32,
no disk), median of --repeats. Prints median tokens/s over --repeats runs, and the machine's load (`uptime`) before and
after: the machine is shared, so numbers taken under load say so.

    /work/venv-vllm/bin/python bench/vllm_throughput.py [--sizes 5m,25m,0.5b] [--threads 1] [--repeats 3]
    /work/venv-vllm/bin/python bench/vllm_throughput.py --smoke     # 5M, 8 x 8, once: does it run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(fn) -> tuple[float, int]:
    t0 = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5m,25m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="5M, 8 prompts x 8 tokens, one repeat")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if args.threads == 1 else f"0-{args.threads - 1}")
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).parent))
    import engine_throughput as et  # the shapes and prompts of the embedded-engine bench

    from baton.protocol import SamplingParams
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.rollout.vllm_engine import VLLMEngine

    n_prompts, new_tokens, repeats = (8, 8, 1) if args.smoke else (64, 64, args.repeats)
    default, shape_of = (n_prompts, new_tokens), {}
    sizes = ["5m"] if args.smoke else args.sizes.split(",")
    print(f"load average before: {load_avg()}  (threads {args.threads}; 2-core machine shared with other jobs)")
    rows = []
    for size in sizes:
        model = et.build(size, "cpu", torch.float32)  # engine_throughput's shapes, 0.5b included
        n_prompts, new_tokens = shape_of[size] = (16, 32) if size == "0.5b" and not args.smoke else default
        vocab = model.config.vocab_size
        prompts = et.make_prompts(vocab, n_prompts)
        params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True, seed=0)
        embedded = EmbeddedEngine(model)
        engine_v = VLLMEngine.build(model, None, max_model_len=512)
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        bare_params = VSP(n=1, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)
        bare_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        seeded = [VSP(n=1, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, detokenize=False, seed=i,
                      logprobs=0) for i in range(len(prompts))]
        methods = {
            "embedded": lambda: sum(len(c.token_ids) for c in embedded.generate(prompts, params)),
            "vllm in baton": lambda: sum(len(c.token_ids) for c in engine_v.generate(prompts, params)),
            "bare vllm": lambda: sum(len(o.outputs[0].token_ids)
                                     for o in engine_v.llm.generate(bare_prompts, bare_params, use_tqdm=False)),
            "bare, seeded": lambda: sum(len(o.outputs[0].token_ids)
                                        for o in engine_v.llm.generate(bare_prompts, seeded, use_tqdm=False)),
        }
        for fn in methods.values():
            fn()  # warm-up (vLLM: first-call kernels; embedded: packing)
        speeds: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(repeats):  # round-robin: a load change on the shared machine hits every method
            for name, fn in methods.items():
                dt, tokens = timed(fn)
                assert tokens == n_prompts * new_tokens, (name, tokens)
                speeds[name].append(tokens / dt)
        for name, v in speeds.items():
            rows.append((size, name, statistics.median(v)))
            print(f"{size:5s} {name:14s} {statistics.median(v):8.0f} tok/s  (runs: {', '.join(f'{x:.0f}' for x in v)})",
                  flush=True)
        syncs = [timed(lambda: engine_v.update_weights(model.named_parameters(), 1) or 0)[0] for _ in range(repeats)]
        print(f"{size:5s} weight sync into vLLM {statistics.median(syncs) * 1e3:6.1f} ms "
              f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params)", flush=True)
        engine_v = None  # frees the engine before the next size (the lambdas above are done with it)
    print(f"load average after: {load_avg()}")
    print("\n| model | prompts x tokens | embedded | vLLM in baton | bare vLLM | bare, seeded | baton / bare seeded |")
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        r = {name: v for s, name, v in rows if s == size}
        print(f"| {size} | {shape_of[size][0]} x {shape_of[size][1]} | {r['embedded']:.0f} | {r['vllm in baton']:.0f} | "
              f"{r['bare vllm']:.0f} | {r['bare, seeded']:.0f} | {r['vllm in baton'] / r['bare, seeded']:.2f}x |")


if __name__ == "__main__":
    main()
