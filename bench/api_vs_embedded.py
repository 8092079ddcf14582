"""The services path's step time next to the embedded path's, and the weight-sync time.

    .venv/bin/python bench/api_vs_embedded.py [--steps 30] [--sync broadcast|checkpoint] [--only api|embedded]

Runs, one after the other on this machine, the same GRPO recipe (demo model, 64 prompts x 8,
4 new tokens, same optimiser) two ways:
  embedded   `baton train recipes/grpo_arithmetic.yaml`: the colocated rollout role
  api        `baton launch recipes/grpo_arithmetic_api.yaml`: baton api + one baton serve +
             `baton env arithmetic` + the trainer pulling batches, pushing weights every step
and prints medians over steps 3..N of timing/step_s, rollout_s (API path: waiting for the
batch), update_s, sync_s (API path: pushing the weights to the server; embedded: a version
bump), verify_s (the `sync/verified` check after the sync: on the API path the server hashes
its model and the trainer compares the digests, issue 49), the lowest `sync/verified` of the
steps, the mean policy age, and the wall time of the whole command.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import SMOKE_TRAIN, add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv: list[str], run_dir: Path) -> tuple[float, list[dict]]:
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{argv[3]} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return wall, [r for r in rows if r.get("step", 0) > 0]


def summary(name: str, wall: float, rows: list[dict]) -> str:
    rows = rows[2:]  # steps 3..N: past start-up

    def med(key: str) -> str:
        vals = [r[key] for r in rows if key in r]
        return f"{statistics.median(vals):.3f}" if vals else "-"

    age = statistics.mean(r.get("rollout/policy_age", 0.0) for r in rows)
    verified = min((r["sync/verified"] for r in rows if "sync/verified" in r), default=None)
    return (f"| {name} | {med('timing/step_s')} | {med('timing/rollout_s')} | {med('timing/update_s')} | "
            f"{med('timing/sync_s')} | {med('timing/verify_s')} | {verified} | {age:.2f} | {wall:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sync", default="broadcast", choices=["broadcast", "checkpoint"])
    ap.add_argument("--api-first", action="store_true", help="run the API path first (load drifts)")
    ap.add_argument("--only", choices=["api", "embedded"], default=None, help="run one path only")
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.steps = 3  # summary() reads steps 3..N
    common = [f"trainer.steps={args.steps}", "data.eval_size=20", "trainer.eval_every=0", "trainer.progress=false"]
    common += SMOKE_TRAIN if args.smoke else []
    tmp = Path(tempfile.mkdtemp(prefix="bench-api-"))
    out = []

    def embedded() -> None:
        wall, rows = run([sys.executable, "-m", "baton.cli", "train", "recipes/grpo_arithmetic.yaml",
                          f"trainer.run_dir={tmp / 'embedded'}", *common], tmp / "embedded")
        out.append(summary("embedded (colocated rollout)", wall, rows))

    def api_path() -> None:
        api, srv = free_port(), free_port()
        extra = [f"rollout.weight_sync={args.sync}"] + ([f"data.weights_dir={tmp / 'weights'}"] if args.sync == "checkpoint"
                                              else [])
        wall, rows = run([sys.executable, "-m", "baton.cli", "launch", "recipes/grpo_arithmetic_api.yaml",
                          f"trainer.run_dir={tmp / 'api'}", f"data.api_url=http://127.0.0.1:{api}",
                          f"data.servers=[http://127.0.0.1:{srv}]", *extra, *common], tmp / "api")
        out.append(summary(f"API path ({args.sync} sync)", wall, rows))

    order = (api_path, embedded) if args.api_first else (embedded, api_path)
    for fn in order if args.only is None else [{"api": api_path, "embedded": embedded}[args.only]]:
        fn()
    print(f"load average before/after: {os.getloadavg()}")
    print("| path | step (s) | rollout / wait (s) | update (s) | sync (s) | verify (s) | sync/verified (min) | "
          "policy age | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(out))


if __name__ == "__main__":
    main()
