"""The actor's update step with and without computing each prompt once per GRPO group.

    .venv/bin/python bench/actor_update.py [--model checkpoints/arith-sft] [--prompts 16 --G 8]

Builds a GRPO-shaped batch (G samples per prompt, prompts of P tokens, responses of
1..R tokens), then times `ActorWorker.update` side by side with
each prompt computed once per group or not, and responses bucketed by length or not
(medians of --repeats, 1 thread).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

import baton.workers.actor as actor_mod
from baton import fields as F
from baton.batch import Batch
from baton.workers.actor import ActorWorker
from baton.workers import sequences
from baton.workers.sequences import response_logprobs
from _common import add_smoke, load_rl_config  # bench/_common.py (scripts run from bench/ on sys.path)


def grpo_batch(prompts: int, G: int, P: int, R: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    rows = prompts * G
    prompt_ids = torch.randint(4, vocab, (prompts, P), generator=g).repeat_interleave(G, 0)  # [B, P]
    lengths = torch.randint(1, R + 1, (rows,), generator=g)  # [B] responses of 1..R tokens
    response_mask = (torch.arange(R) < lengths[:, None]).long()  # [B, R]
    return Batch({F.PROMPT_IDS: prompt_ids, F.PROMPT_MASK: torch.ones(rows, P, dtype=torch.long),
                  F.RESPONSE_IDS: torch.randint(4, vocab, (rows, R), generator=g),
                  F.RESPONSE_MASK: response_mask,
                  F.OLD_LOGPROBS: -torch.rand(rows, R, generator=g),
                  F.ADVANTAGES: torch.randn(rows, R, generator=g)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="checkpoints/arith-sft")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--P", type=int, default=9, help="prompt tokens")
    p.add_argument("--R", type=int, default=8, help="max response tokens (lengths uniform in 1..R)")
    p.add_argument("--repeats", type=int, default=7)
    add_smoke(p)
    a = p.parse_args()
    if a.smoke:
        a.prompts, a.G, a.R, a.repeats = 2, 2, 4, 1
    torch.set_num_threads(1)
    rows = a.prompts * a.G
    cfg = load_rl_config("grpo", None, [
        f"model.path={a.model}", f"data.prompts_per_step={a.prompts}", f"rollout.n={a.G}",
        f"actor.micro_batch_size={rows}", "actor.mini_batch_size=0", f"rollout.max_new_tokens={a.R}"])
    worker = ActorWorker(cfg.model, cfg.actor, cfg.algo, temperature=cfg.rollout.temperature,
                         max_new_tokens=a.R, total_steps=cfg.trainer.steps, seed=0)
    batch = grpo_batch(a.prompts, a.G, a.P, a.R, worker.model.config.vocab_size)
    print(f"actor update: {rows} rows ({a.prompts} prompts x G={a.G}), P={a.P}, R={a.R}, "
          f"model {a.model}, 1 thread, median of {a.repeats}")
    results = {}
    modes = {"every row full forward": (False, None),
             "prompt once, one length bucket": (True, 10**9),
             "prompt once, length buckets": (True, sequences.CALL_COST_TOKENS)}
    for name, (share, call_cost) in modes.items():
        sequences.CALL_COST_TOKENS = call_cost if call_cost is not None else sequences.CALL_COST_TOKENS
        actor_mod.response_logprobs = functools.partial(response_logprobs, share_prompts=share)
        worker.update(batch)  # warm-up
        times = []
        for _ in range(a.repeats):
            start = time.perf_counter()
            worker.update(batch)
            times.append(time.perf_counter() - start)
        results[name] = statistics.median(times)
    base = results["every row full forward"]
    for name, t in results.items():
        print(f"{name:32s} {t * 1e3:8.1f} ms   ({base / t:.2f}x)")


if __name__ == "__main__":
    main()
