"""Memory per rank and step time of the actor under each strategy (issue 12), on real ranks.

    .venv/bin/python bench/memory.py [--sizes 25m,100m] [--steps 3] [--configs ddp1,ddp2,...]

Every rank is a process of its own (gloo, torch.multiprocessing; the controller's host, so
the actor and the colocated rollout role are exactly the trainer's). One step = rollout
(8 arithmetic prompts x 4 samples, 8 new tokens) -> update (random advantages, one
optimizer step) -> weight sync. Per rank we report:
  * peak RSS above the process's baseline (after imports and the process group, before
    the model), sampled every 5 ms, separately for the rollout phase and the update phase;
  * what the rank holds in tensors at the end of the update: parameters (its shard), the
    gradients and the optimizer state, and during rollout the engine's own copy (sharded
    strategies gather one; ddp reads the parameters in place);
  * the median update time over --steps steps (after one warm-up step).
On this CPU-only machine "offload" moves the optimizer state from CPU to CPU: only the
freed gradients show; on CUDA the state leaves the GPU between phases (and fsdp2 keeps
parameters on the CPU with FSDP2's CPUOffloadPolicy).
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import psutil  # noqa: E402  (after the thread setting)
import torch  # noqa: E402

SIZES = {"0.75m": dict(preset="0.75m"), "25m": dict(preset="25m"),
         "100m": dict(preset=None, hidden=768, layers=12, heads=12, kv_heads=4, intermediate=2304)}
# name -> (world size, mesh, strategy, extra actor overrides)
CONFIGS = {
    "ddp1": (1, None, "ddp", ()),
    "ddp2": (2, None, "ddp", ()),
    "fsdp2": (2, None, "fsdp2", ()),
    "fsdp2+offload": (2, None, "fsdp2", ("actor.offload=true",)),
    "fsdp2+ac": (2, None, "fsdp2", ("actor.activation_checkpointing=true",)),
    "tp2": (2, {"tp": 2}, "ddp", ()),
    "fsdp2xtp2": (4, {"fsdp": 2, "tp": 2}, "fsdp2", ()),
}


class PeakRSS:
    """Samples this process's RSS in a thread; `phase()` returns and resets the peak."""

    def __init__(self, interval=0.005):
        self.proc, self.interval, self.peak, self.stop = psutil.Process(), interval, 0, False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def phase(self) -> int:
        """The peak since the last call; then hand freed heap back to the OS (glibc keeps it
        otherwise, and the next phase would inherit this one's high-water mark)."""
        time.sleep(2 * self.interval)
        peak = self.peak
        _trim()
        self.peak = self.proc.memory_info().rss
        return peak


def _trim() -> None:
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _bytes(ts) -> int:
    from torch.distributed.tensor import DTensor
    total = 0
    for t in ts:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def rank_main(rank, world, mesh, strategy, extra, model_dir, steps, port, out):
    torch.set_num_threads(1)
    from baton import fields as F
    from baton.batch import collate
    from baton.config import load_config
    from baton.controller.dispatch import Topology, normalize_mesh
    from baton.controller.worker import HostCore
    from baton.envs import get_task
    from baton.trainers.ppo_config import PPOConfig
    from baton.workers.actor import ActorWorker
    from baton.workers.rollout import RolloutWorker

    import transformers.models.llama.modeling_llama  # noqa: F401  (imports before the baseline)
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401

    topo = Topology(world, normalize_mesh(mesh, world))
    host = HostCore("bench", topo, rank, True)
    host.setup(rank, False, 600.0, ("127.0.0.1", port) if world > 1 else None)
    rss = PeakRSS()
    base = rss.phase()
    cfg = load_config(PPOConfig, overrides=[
        f"model.path={model_dir}", "data.prompts_per_step=8", "rollout.n=4", "rollout.max_new_tokens=8",
        "actor.micro_batch_size=32", f"actor.strategy={strategy}", *extra])
    host.create("actor", ActorWorker, (cfg.model, cfg.actor, cfg.algo),
                dict(temperature=1.0, max_new_tokens=8, total_steps=steps + 1, seed=0))
    host.create("rollout", RolloutWorker, (cfg.rollout,), dict(task="arithmetic", seed=0, probe_prompt="1+2="))
    actor, rollout = host.roles["actor"], host.roles["rollout"]
    setup_peak = rss.phase()
    rows = get_task("arithmetic").train_rows(64, seed=1)
    peaks = {"rollout": 0, "update": 0}
    held = {}
    times = []
    for s in range(steps + 1):
        prompts = collate(rows[8 * (s % 8): 8 * (s % 8) + 8]).chunk(topo.dp_size)[topo.dp_rank(rank)]
        rss.phase()
        batch = host.call("rollout", "generate", "dp_compute", (prompts, s), {})
        peak = rss.phase()
        if s:  # step 0 warms up (and AdamW allocates its state at the first step)
            peaks["rollout"] = max(peaks["rollout"], peak)
        batch[F.OLD_LOGPROBS] = batch[F.ROLLOUT_LOGPROBS]
        g = torch.Generator().manual_seed(s)
        batch[F.ADVANTAGES] = torch.randn(len(batch), 1, generator=g).expand(-1, batch[F.RESPONSE_IDS].shape[1]).clone()
        t0 = time.perf_counter()
        host.call("actor", "update", "dp_compute", (batch,), {})
        times.append(time.perf_counter() - t0)
        peak = rss.phase()
        if s:
            peaks["update"] = max(peaks["update"], peak)
        held = {"params": _bytes(actor.model.parameters()),
                "grads": _bytes(p.grad for p in actor.model.parameters()),
                "optim": _bytes(t for st in actor.optim.state.values() for t in st.values()
                                if isinstance(t, torch.Tensor) and t.dim() > 0),
                "engine_copy": 0}
        host.call("rollout", "sync_weights", "one_to_all", (s + 1,), {})
        held["engine_copy"] = 0 if rollout.policy.in_place else _bytes(rollout.engine.model.parameters())
    rss.stop = True
    res = {"rank": rank, "setup_mb": (setup_peak - base) / 2**20, "rollout_mb": (peaks["rollout"] - base) / 2**20,
           "update_mb": (peaks["update"] - base) / 2**20, "update_s": statistics.median(times[1:]),
           **{k + "_mb": v / 2**20 for k, v in held.items()}}
    with open(f"{out}.{rank}", "wb") as f:
        pickle.dump(res, f)


def run_config(name, model_dir, steps):
    import torch.multiprocessing as mp

    world, mesh, strategy, extra = CONFIGS[name]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    out = tempfile.mktemp(prefix="bench-mem-")
    mp.start_processes(rank_main, args=(world, mesh, strategy, extra, model_dir, steps, port, out),
                       nprocs=world, start_method="spawn")
    res = []
    for r in range(world):
        with open(f"{out}.{r}", "rb") as f:
            res.append(pickle.load(f))
        os.unlink(f"{out}.{r}")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="25m,100m")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the 0.75m model, ddp1 and fsdp2, 1 step: only checks it runs")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.configs, args.steps = "0.75m", "ddp1,fsdp2", 1
    from baton.models.make import make_tiny_checkpoint
    from baton.models.tiny import build_tiny_model, count_params

    tmp = Path(tempfile.mkdtemp(prefix="bench-mem-models-"))
    print("| model | config | ranks | peak RSS over baseline, rollout / update (MB, max over ranks) "
          "| params / grads / optimizer held after update (MB per rank) | engine copy (MB) | update s |")
    print("|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        kw = dict(SIZES[size])
        preset = kw.pop("preset")
        model_dir = make_tiny_checkpoint(tmp / size, preset=preset, seed=0, **kw)
        n = count_params(build_tiny_model(preset, **kw))
        for name in args.configs.split(","):
            res = run_config(name, str(model_dir), args.steps)
            r0 = res[0]
            print(f"| {size} ({n / 1e6:.0f}M) | {name} | {len(res)} | "
                  f"{max(r['rollout_mb'] for r in res):.0f} / {max(r['update_mb'] for r in res):.0f} | "
                  f"{r0['params_mb']:.0f} / {r0['grads_mb']:.0f} / {r0['optim_mb']:.0f} | "
                  f"{r0['engine_copy_mb']:.0f} | {max(r['update_s'] for r in res):.2f} |", flush=True)


if __name__ == "__main__":
    main()
