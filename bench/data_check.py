"""Benchmark: what the start checks of a large data file cost (`check_data`: every row read,
normalised, its length checked, the train / held-out split counted), CPU time and peak RSS.

    OMP_NUM_THREADS=1 .venv/bin/python bench/data_check.py [--rows 2000000]

Writes --rows arithmetic rows ({"prompt": "a+b=", "answer": ...}, one JSON line each) to a
temp file, then runs the checks of `recipes/grpo_arithmetic.yaml` with `data.path` on it in
this process: prints the CPU seconds (`process_time`) and the peak RSS (`ru_maxrss`) before
and after. Issue 50: 2M rows took 2.48 GB and 29 s before the rows were streamed.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import tempfile
import time
from pathlib import Path

from _common import add_smoke

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    add_smoke(ap)
    args = ap.parse_args()
    rows = 2_000 if args.smoke else args.rows
    from baton.config import load_config
    from baton.trainers.ppo_config import PPOConfig
    from baton.trainers.session.inputs import check_data

    path = Path(tempfile.mkdtemp(prefix="bench-data-")) / "rows.jsonl"
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(rows):
            a, b = rng.randrange(100), rng.randrange(100)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    cfg = load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml",
                      [f"data.path={path}", f"model.path={REPO / 'checkpoints/arith-sft'}"])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.process_time()
    check_data(cfg)
    cpu = time.process_time() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{rows:,} rows ({path.stat().st_size / 2**20:.0f} MiB): check_data {cpu:.1f} s CPU, "
          f"peak RSS {peak:.2f} GB (before the check {before:.2f} GB)")


if __name__ == "__main__":
    main()
