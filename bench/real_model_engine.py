"""The embedded engine on a real model: SmolLM2-135M-Instruct (Llama, tied embeddings, GQA
9/3) against HF `generate`, side by side in one run, on this machine.

Two parts, on the chat-arithmetic task's held-out prompts rendered with the model's template:

  * greedy with EOS: both generate up to --new-tokens; the rows whose tokens are identical
    (each cut at its first EOS) and, for the engine, the top logprob check: its greedy
    logprobs against the trainer's teacher-forced log-softmax over the same tokens;
  * throughput: EOS ignored, so both produce exactly prompts x new tokens; median tokens/s over
    --repeats rounds (the methods take turns each round, so other load hits both alike), the
    ratio, and the engine's fraction of this machine's matmul rate at the decode shape.

    .venv/bin/python bench/real_model_engine.py --model $(baton fetch smollm2-135m) [--prompts 32 --new-tokens 32]
    .venv/bin/python bench/real_model_engine.py --smoke      # a tiny random Llama (CI)
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from _common import add_smoke, tiny_model  # bench/_common.py
from engine_throughput import engine_flops, matmul_gflops, run_hf, timed
from baton.data.records import render_prompt
from baton.envs import TASKS
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams


def greedy_hf(model, prompts: list[list[int]], new: int, eos: int) -> list[list[int]]:
    """HF generate's greedy tokens per prompt, left-padded batch, cut after the first EOS."""
    P = max(map(len, prompts))
    ids = torch.full((len(prompts), P), eos, dtype=torch.long)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1
    cfg = GenerationConfig(do_sample=False, max_new_tokens=new, pad_token_id=eos, eos_token_id=eos)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, generation_config=cfg)[:, P:].tolist()
    return [row[:row.index(eos) + 1] if eos in row else row for row in out]


def teacher_forced_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits at each completion token (what the trainer computes)."""
    ids = torch.tensor([prompt + completion])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="an HF dir of SmolLM2-135M-Instruct (`baton fetch smollm2-135m` prints it)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    add_smoke(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.model, args.prompts, args.new_tokens, args.repeats = tiny_model("0.2m"), 4, 8, 1
    if not args.model:
        ap.error("--model is required (or --smoke)")
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    eos = tok.eos_token_id
    rows = TASKS["chat_arithmetic"].eval_rows(args.prompts)
    chat = getattr(tok, "chat_template", None)
    prompts = [tok(render_prompt(tok, r["prompt"]) if chat else r["prompt"][-1]["content"],
                   add_special_tokens=not chat)["input_ids"] for r in rows]
    engine = EmbeddedEngine(model, tok)
    print(f"model={args.model} ({model.config.model_type}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
          f"params, tied={model.config.tie_word_embeddings}, heads {model.config.num_attention_heads}/"
          f"{model.config.num_key_value_heads}) engine runner={type(engine.runner).__name__} "
          f"threads={args.threads} prompts={args.prompts} new_tokens={args.new_tokens}")

    hf_tokens = greedy_hf(model, prompts, args.new_tokens, eos)
    done = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens))
    same = sum(c.token_ids == hf_tokens[c.prompt_index] for c in done)
    worst = max((teacher_forced_logprobs(model, prompts[c.prompt_index], c.token_ids)
                 - torch.tensor(c.logprobs)).abs().max().item() for c in done)
    print(f"greedy: {same}/{len(done)} rows identical to HF generate; engine logprobs vs teacher-forced: "
          f"max |diff| {worst:.2e}")

    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True)
    fns = {"HF generate": lambda: run_hf(model, prompts, args.new_tokens),
           "engine": lambda: sum(len(c.token_ids) for c in engine.generate(prompts, params))}
    res = timed(fns, args.repeats, "cpu")
    rate = {k: n / s for k, (s, n) in res.items()}
    gflops = engine_flops(model, prompts, args.new_tokens) / res["engine"][0] / 1e9
    peak = matmul_gflops(args.prompts, model.config.hidden_size, model.config.intermediate_size)
    print(f"throughput (tokens/s, median of {args.repeats}): HF generate {rate['HF generate']:.0f}, "
          f"engine {rate['engine']:.0f}, ratio engine/HF {rate['engine'] / rate['HF generate']:.2f}x; "
          f"engine {gflops:.1f} GFLOP/s = {gflops / peak:.0%} of this machine's matmul rate at the decode shape "
          f"({peak:.1f} GFLOP/s)")


if __name__ == "__main__":
    main()
