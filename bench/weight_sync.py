"""Latency of each weight-sync transport, for ~5M and ~25M-parameter Qwen2-shaped models.

    .venv/bin/python bench/weight_sync.py [--reps 5] [--sizes 5m,25m] [--threads 2]

Transports (trainer -> engine, medians over --reps pushes):
  inplace               colocated engine shares the module; only the version moves
  checkpoint/local      safetensors written atomically, loaded via engine.update_weights
  checkpoint/http       same file, reloaded by a baton server via /update_weights_from_disk
  broadcast/http b=X    gloo broadcast into a baton server (joined via /init_weights_update_group),
                        flat buckets of X MB (0 = one broadcast per tensor, SGLang style)
The server runs in a thread of this process (uvicorn + its engine thread), so the numbers
include HTTP but share the CPU with the trainer side. After every transport the engine's
logprobs are checked against the trainer's (max |diff| printed).

With --vllm (run it with the vLLM venv), also:
  vllm/copy             colocated `VLLMEngine` (rollout.engine=vllm): load + re-pack, no disk
  vllm/checkpoint/http  a vLLM OpenAI server (a process of its own): safetensors file, then
                        baton's worker extension over /collective_rpc, paused meanwhile
and `--sizes` may name `0.5b` (Qwen2.5-0.5B's shape, random weights, 494M):

    PYTHONPATH=$PWD /work/venv-vllm/bin/python bench/weight_sync.py --vllm --sizes 25m,0.5b --buckets 64
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import torch

from baton.models.tiny import build_tiny_model, count_params
from baton.models.tokenizer import build_char_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.remote import RemoteEngine
from baton.rollout.server import ServerThread, build_app
from baton.sync import BroadcastSync, CheckpointSync, InplaceSync, check_logprob_parity
from _common import add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

PROMPT = [5, 9, 11, 4, 7, 30, 31]


def _bump(model: torch.nn.Module) -> None:
    with torch.no_grad():  # a stand-in optimizer step, so every push carries new values
        for p in model.parameters():
            p.mul_(1.0001)


def _time(sync, trainer, reps: int) -> list[float]:
    """Push reps + 1 times (the first, untimed, warms up imports, page cache, connections)."""
    times = []
    for v in range(1, reps + 2):
        _bump(trainer)
        t0 = time.perf_counter()
        sync.push(trainer.named_parameters(), version=v)
        times.append(time.perf_counter() - t0)
    return times[1:]


def build(preset: str, seed: int) -> torch.nn.Module:
    if preset != "0.5b":
        return build_tiny_model(preset, seed=seed)
    from vllm_throughput import QWEN_05B  # bench/ is on sys.path

    kw = dict(QWEN_05B)
    return build_tiny_model(None, vocab_size=kw.pop("vocab_size"), seed=seed, **kw).eval()


def bench_vllm(preset: str, record, tmp: str) -> None:
    """The vLLM transports (see the module docstring)."""
    import os
    import socket
    import subprocess

    from baton.models.load import save_pretrained
    from baton.rollout.engines import build_engine
    from baton.rollout.vllm_engine import vllm_server_command
    from baton.sync import CopySync

    tok = build_char_tokenizer()
    eng = build_engine("vllm", build(preset, 0), tok, max_model_len=256)
    record("vllm/copy", CopySync(eng), eng, eng)
    del eng
    model_dir = save_pretrained(build(preset, 0), tok, os.path.join(tmp, "vllm-model"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv, env = vllm_server_command(str(model_dir), port, max_model_len=256)
    proc = subprocess.Popen(argv, env={**os.environ, **env, "VLLM_CPU_KVCACHE_SPACE": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        remote = RemoteEngine(f"http://127.0.0.1:{port}", dialect="vllm")
        remote.wait_ready(timeout=600)
        sync = CheckpointSync([remote], directory=tmp)
        record("vllm/checkpoint/http", sync, remote, remote)
        sync.close()
    finally:
        proc.terminate()
        proc.wait(60)


def bench_size(preset: str, reps: int, buckets: list[float], vllm: bool = False) -> list[tuple]:
    tok = build_char_tokenizer()
    trainer = build(preset, seed=1)
    n_params = count_params(trainer)
    mb = sum(p.numel() * p.element_size() for p in trainer.parameters()) / 2**20
    rows = []

    def record(name, sync, engine_for_parity, engine_ref):
        times = _time(sync, trainer, reps)
        diff = check_logprob_parity(engine_for_parity, trainer, PROMPT)
        med = statistics.median(times)
        rows.append((preset, n_params, name, med * 1e3, min(times) * 1e3, mb / med / 1024, diff))
        assert engine_ref.version == reps + 1, (name, engine_ref.version)

    # inplace: the engine reads the trainer's own module
    eng = EmbeddedEngine(trainer, tok)
    record("inplace", InplaceSync(eng), eng, eng)

    tmp = tempfile.mkdtemp(prefix="baton-bench-")
    try:
        if vllm:
            bench_vllm(preset, record, tmp)
        eng = EmbeddedEngine(build(preset, 0), tok)
        sync = CheckpointSync([eng], directory=tmp)
        record("checkpoint/local", sync, eng, eng)
        sync.close()

        eng = EmbeddedEngine(build(preset, 0), tok)
        with ServerThread(build_app(eng, tok, preset)) as server:
            remote = RemoteEngine(server.url)
            sync = CheckpointSync([remote], directory=tmp)
            record("checkpoint/http", sync, remote, eng)
            sync.close()
            eng.version = 0
            for b in buckets:
                sync = BroadcastSync([remote], bucket_mb=b)
                record(f"broadcast/http b={b:g}MB", sync, remote, eng)
                sync.close()
                eng.version = 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="5m,25m")
    ap.add_argument("--buckets", default="0,4,64", help="broadcast bucket sizes in MB (0 = per tensor)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on an oversubscribed CPU multi-threaded copies stall)")
    ap.add_argument("--vllm", action="store_true", help="also the vLLM transports (needs vLLM)")
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.reps, args.sizes, args.buckets = 1, "0.75m", "0,4"
    torch.set_num_threads(args.threads)
    buckets = [float(b) for b in args.buckets.split(",")]
    rows = []
    for preset in args.sizes.split(","):
        rows += bench_size(preset, args.reps, buckets, vllm=args.vllm)
    print(f"\nweight sync latency, median of {args.reps} pushes, fp32, torch threads={args.threads}")
    print(f"{'model':>6} {'params':>7} {'transport':<24} {'median ms':>10} {'min ms':>8} {'GB/s':>6} {'parity':>8}")
    for preset, n, name, med, mn, gbs, diff in rows:
        rate = "-" if name == "inplace" else f"{gbs:.2f}"  # nothing moves in place
        print(f"{preset:>6} {n / 1e6:>6.1f}M {name:<24} {med:>10.1f} {mn:>8.1f} {rate:>6} {diff:>8.1e}")


if __name__ == "__main__":
    main()
