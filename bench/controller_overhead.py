"""Benchmark: what one WorkerGroup call costs on top of moving the data.

    .venv/bin/python bench/controller_overhead.py [--iters 50 --rows 64 --cols 512]

Rows (median ms over --iters calls after 5 warm-up calls, one table):
  * DP_COMPUTE on 2 Ray workers: the batch is chunked, shipped, returned (identity), concatenated;
  * the same call on the local backend (no transport at all: the controller's own cost);
  * bare Ray, 1 actor: ray.put(batch) + identity actor call + ray.get (the transport floor);
  * bare Ray, 2 actors: the same with the two pre-made halves, as DP_COMPUTE sends them;
  * a no-argument ONE_TO_ALL call on 2 Ray workers (the fixed round-trip cost).
The batch: input_ids / attention_mask (int64), old_logprobs (fp32), ref_logprobs (bf16), all [rows, cols].
"""

from __future__ import annotations

import argparse

import ray
import torch

from baton.batch import Batch
from baton.controller import Dispatch, ResourcePool, Worker, WorkerGroup, ensure_ray, register, shutdown_ray
from _common import add_smoke  # bench/_common.py
from _timing import median_ms  # bench/_timing.py (scripts run from bench/ on sys.path)


class Identity(Worker):
    @register(dispatch=Dispatch.DP_COMPUTE)
    def identity(self, batch: Batch) -> Batch:
        return batch

    @register
    def ping(self) -> int:
        return self.rank


@ray.remote(num_cpus=0)
class Echo:
    def identity(self, x):
        return x


def make_batch(rows: int, cols: int) -> Batch:
    return Batch({"input_ids": torch.randint(0, 32000, (rows, cols)),  # [B, T]
                  "attention_mask": torch.ones(rows, cols, dtype=torch.long),  # [B, T]
                  "old_logprobs": torch.randn(rows, cols),  # [B, T]
                  "ref_logprobs": torch.randn(rows, cols).to(torch.bfloat16)})  # [B, T]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=512)
    add_smoke(ap)
    a = ap.parse_args()
    if a.smoke:
        a.iters, a.rows, a.cols = 2, 4, 8
    torch.set_num_threads(1)
    batch = make_batch(a.rows, a.cols)
    mb = sum(t.numel() * t.element_size() for t in batch.tensors.values()) / 2**20
    ensure_ray(num_cpus=8)
    try:
        ray_group = WorkerGroup(ResourcePool(2, backend="ray"), Identity)
        local_group = WorkerGroup(ResourcePool(1, backend="local"), Identity)
        out = ray_group.identity(batch)
        assert torch.equal(out["input_ids"], batch["input_ids"])  # the call really moves the data
        echo1, echo2 = Echo.remote(), Echo.remote()
        halves = batch.chunk(2)

        def bare1():
            ray.get(echo1.identity.remote(ray.put(batch)))

        def bare2():
            ray.get([e.identity.remote(ray.put(h)) for e, h in zip((echo1, echo2), halves)])

        rows = [
            ("DP_COMPUTE, 2 Ray workers", median_ms(lambda: ray_group.identity(batch), a.iters, warmup=5)),
            ("DP_COMPUTE, local backend", median_ms(lambda: local_group.identity(batch), a.iters, warmup=5)),
            ("bare Ray, 1 actor (put+call+get)", median_ms(bare1, a.iters, warmup=5)),
            ("bare Ray, 2 actors, halves", median_ms(bare2, a.iters, warmup=5)),
            ("ONE_TO_ALL ping, 2 Ray workers", median_ms(ray_group.ping, a.iters, warmup=5)),
        ]
        print(f"\nbatch {a.rows} x {a.cols}, {len(batch.tensors)} tensors, {mb:.2f} MiB; "
              f"median of {a.iters} calls")
        print(f"{'call':<36}{'ms':>10}")
        for name, ms in rows:
            print(f"{name:<36}{ms:>10.2f}")
        ray_group.shutdown()
        local_group.shutdown()
    finally:
        shutdown_ray()


if __name__ == "__main__":
    main()
