"""The embedded engine at two versions of baton, side by side in one run: this checkout
("after") and a git revision ("before", default main), on bench/engine_throughput.py's
models and prompts (random weights, sampled at temperature 1).

Each measurement runs in a subprocess with the version's `baton/` first on PYTHONPATH (the
before tree comes from `git archive`); the versions take turns in every round, so load from
other processes on a shared machine hits them alike. Configurations (CPU):

  default       the engine as a CPU runs it (no static decode, a look every step), EOS ignored
  static        static decode forced on ("fixed": the step a GPU captures, run eagerly) and
                a look every 8 steps, as a GPU decodes; EOS ignored
  static+stops  the same with 4 stop strings that never match (a look at them every step
                before; every 8 steps after) and EOS (id 2) as a stop id

Per configuration: median tokens/s; for the static ones also the steps made over the calls
of a run (a warm-up and --calls calls in one engine: one capture each on a GPU) and the host
reads of device tensors per step (prefill and decode steps of one call, all its rows at once;
tests/device_fault_mode.py, the engine on cpu:1).

    .venv/bin/python bench/engine_before_after.py [--before main] [--repeats 3] [--size 0.75m]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from _common import REPO, add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

CONFIGS = ("default", "static", "static+stops")

CHILD = r"""
import json, sys, time
import torch
sys.path.insert(1, {bench!r})
from engine_throughput import SIZES, build, make_prompts
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from baton.rollout.embedded import static_decode
from tests.device_fault_mode import WORKER, DeviceFaultMode

torch.set_num_threads(1)
size, prompts_n, new, calls, config = {size!r}, {prompts!r}, {new!r}, {calls!r}, {config!r}
made = [0]
real = static_decode.StaticDecoder._make_step
def counted(self):
    made[0] += 1  # before: a step made (a capture on a GPU) each time a group enters a bucket
    return real(self)
static_decode.StaticDecoder._make_step = counted
model = build(size, "cpu", torch.float32)
prompts = make_prompts(model.config.vocab_size, prompts_n)
kw = dict(ignore_eos=True) if config != "static+stops" else dict(stop=["zzzz", "qqqq", "xyxy", "@@@@"], stop_token_ids=[2])
params = SamplingParams(temperature=1.0, max_new_tokens=new, seed=0, **kw)
opts = {{}} if config == "default" else dict(static_decode="fixed", sync_every=8)
from baton.models.tokenizer import build_char_tokenizer
engine = EmbeddedEngine(model, build_char_tokenizer(), **opts)
engine.generate(prompts, params)  # warm-up
times, tokens = [], 0
for _ in range(calls):
    t0 = time.perf_counter()
    tokens = sum(len(c.token_ids) for c in engine.generate(prompts, params))
    times.append(time.perf_counter() - t0)
steps_made = engine.graphs.captures if hasattr(engine, "graphs") else made[0]  # after: only new ones
reads = None
if config != "default":
    mode = DeviceFaultMode()
    with mode:
        dev = EmbeddedEngine(build(size, "cpu", torch.float32).to(WORKER), build_char_tokenizer(), **opts)
        with mode.in_region("generate"):
            gen = dev.start_generation(prompts, params)
            gen.advance()
    reads = mode.reads["generate"] / gen.steps  # per prefill / decode step (all rows)
print(json.dumps(dict(seconds=min(times), tokens=tokens, steps_made=steps_made, calls=calls + 1, reads_per_step=reads)))
"""


def before_tree(rev: str, into: Path) -> Path:
    """baton/ (and tests/device_fault_mode.py's package) at `rev`, extracted under `into`."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev, "baton"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(tree: Path, args, config: str) -> dict:
    code = CHILD.format(bench=str(REPO / "bench"), size=args.size, prompts=args.prompts, new=args.new_tokens,
                        calls=args.calls, config=config)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{tree} {config}: exited {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="main", help="the git revision to compare with (default main)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each runs every version and configuration")
    ap.add_argument("--calls", type=int, default=2, help="timed generate calls per measurement (the best is kept)")
    ap.add_argument("--size", default="0.75m")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    add_smoke(ap)
    args = ap.parse_args()
    configs = CONFIGS
    if args.smoke:
        args.repeats, args.calls, args.prompts, args.new_tokens, configs = 1, 1, 8, 8, CONFIGS[-1:]
    with tempfile.TemporaryDirectory(prefix="baton-before-") as tmp:
        trees = {"before": before_tree(args.before, Path(tmp)), "after": REPO}
        runs: dict[tuple[str, str], list[dict]] = {}
        for _ in range(args.repeats):
            for config in configs:
                for version, tree in trees.items():  # take turns: the same load for both
                    runs.setdefault((version, config), []).append(measure(tree, args, config))
    print(f"size={args.size} prompts={args.prompts} new_tokens={args.new_tokens} repeats={args.repeats} "
          f"calls={args.calls} threads=1 before={args.before} (medians of the rounds' best calls)")
    print(f"{'config':>13} | {'before tok/s':>12} {'after tok/s':>11} {'after/before':>12} | "
          f"{'steps made b/a':>14} | {'host reads/step b/a':>19}")
    for config in configs:
        b, a = runs["before", config], runs["after", config]
        tps = [statistics.median(r["tokens"] / r["seconds"] for r in x) for x in (b, a)]
        made = "-" if config == "default" else f"{b[0]['steps_made']}/{a[0]['steps_made']} ({a[0]['calls']} calls)"
        reads = "-" if b[0]["reads_per_step"] is None else \
            f"{b[0]['reads_per_step']:.3f}/{a[0]['reads_per_step']:.3f}"
        print(f"{config:>13} | {tps[0]:>12.0f} {tps[1]:>11.0f} {tps[1] / tps[0]:>12.2f} | {made:>14} | {reads:>19}")


if __name__ == "__main__":
    main()
