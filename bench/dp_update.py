"""Benchmark: data-parallel speed-up of the actor's update, 1 vs 2 Ray ranks, and what it costs.

    .venv/bin/python bench/dp_update.py [--prompts 64 --G 8 --P 9 --R 4 --mini 128 --repeats 5]
                                        [--sizes local,1,2,2x1]

The demo's update (64 prompts x 8 samples, 4 optimizer steps of 128 rows, the demo model)
on a Ray pool of 1 and of 2 ranks (one torch thread each), and in the driver's own process
(local backend). Per configuration, medians of --repeats: the driver's wall time of
`group.update(batch)`, the time inside the ranks' `update` (the slowest rank), and the rest
(dispatch: splitting the batch, shipping it, collecting metrics), and the time the slowest
rank spent in the gradient all-reduce (`par.sync_grads`, wrapped here; it includes waiting
for the other rank to finish its backward), and the CPU time of the busiest rank's update
(process CPU seconds): on a shared machine wall times say how the cores were shared, CPU
seconds how the work was split; their ratio 1 rank / 2 ranks is the speed-up the update
reaches when each rank has a core of its own.

`2x1` is the ceiling data parallel is measured against: two independent 1-rank Ray pools,
each updating its half of the batch (the rows a rank of 2 gets, in the same optimizer steps)
at the same time, with no collective between them. Its speed-up over 1 rank is what two
processes on this machine give when communication and waiting for a peer cost nothing;
what 2 ranks lose against it is the all-reduces and the waits.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
from transformers import AutoConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ (also for the Ray workers, via PYTHONPATH)
from _common import DEMO_MODEL, add_smoke, load_rl_config  # noqa: E402
from actor_update import grpo_batch  # noqa: E402

from baton.controller import Dispatch, ResourcePool, WorkerGroup, ensure_ray, register, shutdown_ray  # noqa: E402
from baton.workers.actor import ActorWorker  # noqa: E402


class TimedActor(ActorWorker):
    """The actor, timing its own update and the gradient all-reduce inside it."""

    @register(dispatch=Dispatch.DP_COMPUTE)
    def update(self, batch):
        sync, t_sync = self.par.sync_grads, [0.0, 0.0]

        def timed_sync(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            out = sync(*args, **kwargs)
            t_sync[0] += time.perf_counter() - t0
            t_sync[1] += time.process_time() - c0
            return out
        self.par.sync_grads = timed_sync
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            out = super().update(batch)
        finally:
            self.par.sync_grads = sync
        self._timing = (time.perf_counter() - t0, t_sync[0], time.process_time() - c0, t_sync[1])
        return out

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def timing(self):
        return self._timing


def measure(group: WorkerGroup, batch, repeats: int) -> dict[str, float]:
    group.update(batch)  # warm-up
    walls, ranks, syncs, cpus, sync_cpus = [], [], [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        group.update(batch)
        walls.append(time.perf_counter() - t0)
        per_rank = group.timing()
        ranks.append(max(t[0] for t in per_rank))
        syncs.append(max(t[1] for t in per_rank))
        cpus.append(max(t[2] for t in per_rank))
        sync_cpus.append(max(t[3] for t in per_rank))
    wall, rank = statistics.median(walls), statistics.median(ranks)
    return {"wall": wall, "rank": rank, "sync": statistics.median(syncs), "dispatch": wall - rank,
            "cpu": statistics.median(cpus), "sync_cpu": statistics.median(sync_cpus)}


class Pair:
    """Two independent 1-rank groups (`2x1`), each updating its half of a batch at once:
    `update` and `timing` as a WorkerGroup's (`measure` times it the same way)."""

    def __init__(self, groups: list[WorkerGroup]):
        self.groups = groups

    def update(self, batch) -> None:
        halves = batch.chunk(2)  # the rows each rank of 2 gets (DP_COMPUTE's split)
        threads = [threading.Thread(target=g.update, args=(h,)) for g, h in zip(self.groups, halves)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def timing(self) -> list[tuple[float, float, float, float]]:
        return [g.timing()[0] for g in self.groups]

    def shutdown(self) -> None:
        for g in self.groups:
            g.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEMO_MODEL))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--P", type=int, default=9, help="prompt tokens")
    ap.add_argument("--R", type=int, default=4, help="max response tokens")
    ap.add_argument("--mini", type=int, default=128, help="rows per optimizer step (all ranks)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="local,1,2,2x1",
                    help="local and/or Ray pool sizes, and 2x1 (two 1-rank pools on half the batch each, at once)")
    add_smoke(ap)
    a = ap.parse_args()
    if a.smoke:
        a.prompts, a.G, a.mini, a.repeats, a.sizes = 4, 2, 4, 1, "local,2,2x1"
    if "2x1" in a.sizes.split(",") and (a.prompts % 2 or a.mini % 2):
        ap.error(f"2x1 halves the batch: --prompts ({a.prompts}) must be even and --mini ({a.mini}) "
                 "even")
    torch.set_num_threads(1)
    rows = a.prompts * a.G

    def config(prompts: int, mini: int):
        return load_rl_config("grpo", None, [f"model.path={a.model}", f"data.prompts_per_step={prompts}",
                                             f"rollout.n={a.G}", f"actor.micro_batch_size={mini}",
                                             f"actor.mini_batch_size={mini}", f"rollout.max_new_tokens={a.R}"])
    cfg = config(a.prompts, a.mini)
    args = (cfg.model, cfg.actor, cfg.algo)
    halved = config(a.prompts // 2, a.mini // 2)  # 2x1: one rank of 2's share, as its own whole run
    kw = dict(temperature=cfg.rollout.temperature, max_new_tokens=a.R, total_steps=cfg.trainer.steps, seed=0)
    bench_dir = str(Path(__file__).resolve().parent)
    ensure_ray(num_cpus=8, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
        [bench_dir, os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}})
    vocab = AutoConfig.from_pretrained(a.model).vocab_size
    res = {}
    try:
        for size in a.sizes.split(","):
            if size == "2x1":
                group = Pair([WorkerGroup(ResourcePool(1, backend="ray", threads_per_worker=1), TimedActor,
                                          halved.model, halved.actor, halved.algo, **kw) for _ in range(2)])
            else:
                pool = (ResourcePool(1, backend="local", threads_per_worker=1) if size == "local"
                        else ResourcePool(int(size), backend="ray", threads_per_worker=1))
                group = WorkerGroup(pool, TimedActor, *args, **kw)
            batch = grpo_batch(a.prompts, a.G, a.P, a.R, vocab)
            res[size] = measure(group, batch, a.repeats)
            group.shutdown()
            print(f"{size}: {res[size]}", flush=True)
    finally:
        shutdown_ray()
    print(f"\nactor update, {rows} rows ({a.prompts} x G={a.G}), {rows // a.mini} optimizer steps of {a.mini}, "
          f"{Path(a.model).name}, 1 thread per rank, median of {a.repeats}, load {os.getloadavg()[0]:.1f}")
    print("| ranks | update wall (s) | inside the slowest rank (s) | grad all-reduce (s) | dispatch (s) | speed-up "
          "| CPU s, busiest rank | of which in the all-reduce | CPU-work speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = res.get("1") or res.get("local")
    for size, r in res.items():
        print(f"| {size} | {r['wall']:.3f} | {r['rank']:.3f} | {r['sync']:.4f} | {r['dispatch']:.3f} "
              f"| {base['wall'] / r['wall']:.2f}x | {r['cpu']:.3f} | {r['sync_cpu']:.3f} "
              f"| {base['cpu'] / r['cpu']:.2f}x |")
    if "2" in res and "2x1" in res:
        print(f"\n2 ranks reach {res['2x1']['wall'] / res['2']['wall']:.2f} of 2x1's speed (two processes on half the "
              "batch each with no collective: data parallel's ceiling on this machine, in this run)")


if __name__ == "__main__":
    main()
