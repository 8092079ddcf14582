"""The embedded engine: an in-process rollout engine over an HF causal LM, in pure PyTorch
(`engine.py`'s `EmbeddedEngine`, registered as `rollout.engine: embedded`). Its parts:

  engine.py         EmbeddedEngine: generate / start_generation, weights, LoRA serving, sleep
  llama.py          the fast path: a hand-written forward (Llama, Qwen2/3, Mistral) with a KV cache
  moe.py            the fast path's mixture-of-experts MLP (Qwen3-MoE, Mixtral)
  kernels.py        fused pieces of the fast path (RMSNorm, rotary embeddings)
  hf.py             every other model through its own HF forward
  sampling.py       temperature / top-k / top-p / min-p sampling and its logprobs
  static_decode.py  the decode step over static buckets, captured as CUDA graphs (cuda_graphs.py)
  generation.py     a call run k steps at a time (`baton serve` interleaves them)
  kv_budget.py      how many KV-cache tokens a call may hold (fixed, or a fraction of free memory)
  stop_strings.py   stop strings matched over the tokens since the last look
  live_lora.py      a LoRA policy's live adapter tensors, applied without merging
  op_count.py       kernels a decode step launches, counted by a dispatch recorder

Shared by every engine, beside this package: the protocol (`baton.protocol`), the engine
registry (`baton.rollout.engines`), grammars (`baton.rollout.grammars`,
`baton.rollout.constrained`), the HTTP server (`baton.rollout.server`).
"""
