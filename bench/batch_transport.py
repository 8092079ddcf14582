"""Benchmark: moving a `Batch` vs a plain dict of tensors, pickled and through Ray.

    .venv/bin/python bench/batch_transport.py [--iters 30]

For each size (rows x cols, four tensors: int64 ids and mask, fp32 and bf16 logprobs) and
each container, side by side (median ms over --iters):
  * pickle: bytes of pickle.dumps (default protocol, in-band), dumps + loads time;
  * pickle5 oob: protocol 5 with out-of-band buffers (what Ray does): in-band bytes, time;
  * ray: ray.put + identity actor call + ray.get (a real trip to another process).
A Batch ships every tensor as one numpy buffer (bf16 viewed as int16); the dict of tensors
goes through torch's own reduction (storages).
"""

from __future__ import annotations

import argparse
import pickle

import ray
import torch

from baton.batch import Batch
from baton.controller import ensure_ray, shutdown_ray
from _common import add_smoke  # bench/_common.py
from _timing import median_ms  # bench/_timing.py (scripts run from bench/ on sys.path)


@ray.remote(num_cpus=0)
class Echo:
    def identity(self, x):
        return x


def tensors(rows: int, cols: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, 32000, (rows, cols)),  # [B, T]
            "attention_mask": torch.ones(rows, cols, dtype=torch.long),  # [B, T]
            "old_logprobs": torch.randn(rows, cols),  # [B, T]
            "ref_logprobs": torch.randn(rows, cols).to(torch.bfloat16)}  # [B, T]


def measure(obj, echo, iters: int) -> dict[str, float]:
    blob = pickle.dumps(obj)
    buffers: list = []
    oob = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)

    def p5():
        bufs: list = []
        pickle.loads(pickle.dumps(obj, protocol=5, buffer_callback=bufs.append), buffers=bufs)

    return {"pickle_bytes": len(blob),
            "pickle_ms": median_ms(lambda: pickle.loads(pickle.dumps(obj)), iters),
            "p5_inband_bytes": len(oob),
            "p5_ms": median_ms(p5, iters),
            "ray_ms": median_ms(lambda: ray.get(echo.identity.remote(ray.put(obj))), iters)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    add_smoke(ap)
    a = ap.parse_args()
    sizes = ((8, 16),) if a.smoke else ((64, 512), (256, 2048))
    a.iters = 2 if a.smoke else a.iters
    torch.set_num_threads(1)
    ensure_ray(num_cpus=8)
    try:
        echo = Echo.remote()
        print(f"\nmedian of {a.iters}; bytes are the pickled size (in-band part for protocol 5)")
        print(f"{'size':<12}{'container':<12}{'pickle B':>12}{'pickle ms':>11}{'p5 inband B':>13}"
              f"{'p5 ms':>9}{'ray ms':>9}")
        for rows, cols in sizes:
            data = tensors(rows, cols)
            for name, obj in (("Batch", Batch(dict(data))), ("dict", dict(data))):
                m = measure(obj, echo, a.iters)
                print(f"{f'{rows}x{cols}':<12}{name:<12}{m['pickle_bytes']:>12,}{m['pickle_ms']:>11.2f}"
                      f"{m['p5_inband_bytes']:>13,}{m['p5_ms']:>9.2f}{m['ray_ms']:>9.2f}")
    finally:
        shutdown_ray()


if __name__ == "__main__":
    main()
