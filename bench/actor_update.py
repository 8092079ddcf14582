"""The actor's update step with and without computing each prompt once per GRPO group.

    .venv/bin/python bench/actor_update.py [--model checkpoints/arith-sft] [--prompts 16 --G 8]

Builds a GRPO-shaped batch (G samples per prompt, prompts left-padded to P tokens,
responses of R tokens), then times `ActorWorker.update` side by side with
`share_prompts` on and off (medians of --repeats, 1 thread).
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
from baton.config import load_config
from baton.trainers.grpo_config import GRPOConfig
from baton.workers.actor import ActorWorker
from baton.workers.sequences import response_logprobs


def grpo_batch(prompts: int, G: int, P: int, R: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    rows = prompts * G
    prompt_ids = torch.randint(4, vocab, (prompts, P), generator=g).repeat_interleave(G, 0)  # [B, P]
    return Batch({F.PROMPT_IDS: prompt_ids, F.PROMPT_MASK: torch.ones(rows, P, dtype=torch.long),
                  F.RESPONSE_IDS: torch.randint(4, vocab, (rows, R), generator=g),
                  F.RESPONSE_MASK: torch.ones(rows, R, dtype=torch.long),
                  F.OLD_LOGPROBS: -torch.rand(rows, R, generator=g),
                  F.ADVANTAGES: torch.randn(rows, R, generator=g)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="checkpoints/arith-sft")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--P", type=int, default=9, help="prompt tokens")
    p.add_argument("--R", type=int, default=4, help="response tokens")
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = a.prompts * a.G
    cfg = load_config(GRPOConfig, overrides=[
        f"model.path={a.model}", f"data.prompts_per_step={a.prompts}", f"rollout.n={a.G}",
        f"actor.micro_batch_size={rows}", "actor.mini_batch_size=0", f"rollout.max_new_tokens={a.R}"])
    worker = ActorWorker(cfg)
    batch = grpo_batch(a.prompts, a.G, a.P, a.R, worker.model.config.vocab_size)
    print(f"actor update: {rows} rows ({a.prompts} prompts x G={a.G}), P={a.P}, R={a.R}, "
          f"model {a.model}, 1 thread, median of {a.repeats}")
    results = {}
    for share in (False, True):
        actor_mod.response_logprobs = functools.partial(response_logprobs, share_prompts=share)
        worker.update(batch)  # warm-up
        times = []
        for _ in range(a.repeats):
            start = time.perf_counter()
            worker.update(batch)
            times.append(time.perf_counter() - start)
        results[share] = statistics.median(times)
    print(f"{'every row full forward':32s} {results[False] * 1e3:8.1f} ms")
    print(f"{'each prompt once per group':32s} {results[True] * 1e3:8.1f} ms   "
          f"({results[False] / results[True]:.2f}x)")


if __name__ == "__main__":
    main()
