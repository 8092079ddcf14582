"""LoRA: bytes and time per weight sync, adapter-only vs full weights; and what applying a
live adapter costs the embedded engine.

    .venv/bin/python bench/lora_sync.py [--reps 5] [--size 25m] [--rank 8]

Trainer: a Qwen2-shaped model (preset `--size`) with LoRA on every linear of every layer
(rank `--rank`, peft). Per push (medians over --reps; each push follows a stand-in
optimizer step on the adapters):
  full / checkpoint, local   all weights: safetensors written, loaded by an in-process engine
  full / checkpoint, HTTP    the same file, reloaded by a baton server (/update_weights_from_disk)
  adapter / LoraSync, local  the adapter tensors into an in-process engine (load_lora_adapter)
  adapter / LoraSync, HTTP   a PEFT dir written, /unload_lora_adapter + /load_lora_adapter
  adapter / in place         the colocated engine reads the live adapters: nothing moves
After each transport the engine's logprobs are checked against the trainer's peft model.

Engine side: 32 prompts x 32 new tokens (greedy) with the colocated peft model, on the
fast path with the adapter applied unmerged (fuse_weights=False: two rank-r matmuls per
adapted linear, nothing copied), merged into the fused copy (fuse_weights=True), through
peft's HF forward, and the base model without LoRA for reference.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from baton.models.lora import LoraAdapterConfig, adapter_config, adapter_tensors, apply_lora
from baton.models.tiny import build_tiny_model, count_params
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from baton.rollout.remote import RemoteEngine
from baton.rollout.server import ServerThread, build_app
from baton.sync import CheckpointSync, check_logprob_parity
from baton.sync.lora import LoraSync
from _common import add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

PROMPT = [5, 9, 11, 4, 7, 30, 31]


def step(pm) -> None:
    with torch.no_grad():  # a stand-in optimizer step on the adapters (lora_B starts at 0)
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 1e-3)


def parity_lora(engine, pm, name) -> float:
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=4, ignore_eos=True, lora=name)
    c = engine.generate([PROMPT], params)[0]
    seq = torch.tensor([PROMPT + c.token_ids])
    with torch.no_grad():
        lp = torch.log_softmax(pm(input_ids=seq).logits[0].float(), -1)
    ref = lp[len(PROMPT) - 1:-1].gather(-1, seq[0, len(PROMPT):, None])[:, 0]
    return float((ref - torch.tensor(c.logprobs)).abs().max())


def timed(push, reps, pm=None) -> float:
    times = []
    for v in range(reps + 1):  # the first push warms up (imports, connections, page cache)
        if pm is not None:
            step(pm)  # untimed: the stand-in optimizer step
        t0 = time.perf_counter()
        push(v + 1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--size", default="25m")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.reps, args.size = 1, "0.75m"
    torch.set_num_threads(args.threads)
    base = build_tiny_model(args.size, seed=0).eval()
    n_base = count_params(base)
    pm = apply_lora(base, LoraAdapterConfig(rank=args.rank, alpha=2 * args.rank)).eval()
    step(pm)
    n_lora = sum(t.numel() for _, t in adapter_tensors(pm))
    print(f"{args.size}: {n_base / 1e6:.1f}M base params, LoRA r={args.rank} on all linears: "
          f"{n_lora / 1e6:.2f}M adapter params ({100 * n_lora / n_base:.1f}%)\n")
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-lora-"))

    # full weights (the merged policy is what an engine without LoRA would need)
    local_full = EmbeddedEngine(build_tiny_model(args.size, seed=1).eval(), fuse_weights=False)
    ck = CheckpointSync(local_full, directory=tmp / "full")

    def push_full_local(v):
        ck.push(_merged(pm), v)
    ms = timed(push_full_local, args.reps, pm)
    nbytes = sum(t.numel() * t.element_size() for _, t in _merged(pm))
    rows.append(("full weights", "checkpoint, local", nbytes, ms,
                 check_logprob_parity(local_full, _merged_model(pm), PROMPT, 4)))

    srv_engine = EmbeddedEngine(build_tiny_model(args.size, seed=1).eval(), fuse_weights=False)
    server = ServerThread(build_app(srv_engine, None, "base", weights_dirs=[tmp]))
    remote = RemoteEngine(server.url)
    ck_http = CheckpointSync(remote, directory=tmp / "full_http")

    def push_full_http(v):
        ck_http.push(_merged(pm), v)
    ms = timed(push_full_http, args.reps, pm)
    rows.append(("full weights", "checkpoint, HTTP", nbytes, ms,
                 check_logprob_parity(srv_engine, _merged_model(pm), PROMPT, 4)))

    # adapter only
    local_lora = EmbeddedEngine(build_tiny_model(args.size, seed=0).eval(), fuse_weights=False)
    ls = LoraSync(local_lora, adapter_config(pm))

    def push_lora_local(v):
        ls.push(adapter_tensors(pm), v)
    ms = timed(push_lora_local, args.reps, pm)
    rows.append(("adapter only", "LoraSync, local", ls.last_bytes, ms, parity_lora(local_lora, pm, "policy")))

    srv2 = EmbeddedEngine(build_tiny_model(args.size, seed=0).eval(), fuse_weights=False)
    server2 = ServerThread(build_app(srv2, None, "base", weights_dirs=[tmp]))
    remote2 = RemoteEngine(server2.url)
    ls_http = LoraSync(remote2, adapter_config(pm), directory=tmp / "lora_http")

    def push_lora_http(v):
        ls_http.push(adapter_tensors(pm), v)
    ms = timed(push_lora_http, args.reps, pm)
    rows.append(("adapter only", "LoraSync, HTTP", ls_http.last_bytes, ms, parity_lora(srv2, pm, "policy")))
    colocated = EmbeddedEngine(pm, fuse_weights=False)
    rows.append(("adapter only", "in place (colocated)", 0, 0.0, check_logprob_parity(colocated, pm, PROMPT, 4)))

    print("| sync | transport | bytes / sync | ms / sync (median) | max logprob diff after |")
    print("|---|---|---|---|---|")
    for what, how, b, ms, diff in rows:
        print(f"| {what} | {how} | {b / 1e6:.2f} MB | {ms:.0f} | {diff:.1e} |")
    server.stop()
    server2.stop()

    # engine cost of a live adapter
    print("\n| engine (32 prompts x 32 tokens, greedy) | tokens/s |")
    print("|---|---|")
    prompts = [[4 + (i * 7 + j) % 200 for j in range(8 + i % 8)] for i in range(32)]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=32, ignore_eos=True)
    engines = {"base model, no LoRA (fast path, fuse_weights=False)": EmbeddedEngine(_merged_model(pm), fuse_weights=False),
               "base model, no LoRA (fast path, fuse_weights=True)": EmbeddedEngine(_merged_model(pm), fuse_weights=True),
               "peft model, adapter unmerged (fast path, fuse_weights=False)": EmbeddedEngine(pm, fuse_weights=False),
               "peft model, adapter merged into the fused copy (fuse_weights=True)":
                   EmbeddedEngine(pm, fuse_weights=True),
               "peft model through its HF forward": EmbeddedEngine(pm, fast=False)}
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(args.reps):  # round robin: load on the machine hits every engine alike
        for label, engine in engines.items():
            t0 = time.perf_counter()
            engine.generate(prompts, params)
            times[label].append(time.perf_counter() - t0)
    for label, ts in times.items():
        print(f"| {label} | {32 * 32 / statistics.median(ts):.0f} |")


def _merged(pm):
    """(HF name, tensor) of base + scale * B @ A: what a full-weights sync sends."""
    out, seen = [], set()
    base = pm.get_base_model()
    lora = {n: m for n, m in base.named_modules() if hasattr(m, "lora_A")}
    for name, t in base.state_dict().items():
        if "lora_" in name or t.data_ptr() in seen:  # adapters; a tied alias (lm_head) once
            continue
        seen.add(t.data_ptr())
        mod = name.rsplit(".", 2)[0] if ".base_layer." in name else None
        if mod in lora and name.endswith("base_layer.weight"):
            m = lora[mod]
            t = t + m.scaling["default"] * m.lora_B["default"].weight @ m.lora_A["default"].weight
        out.append((name.replace(".base_layer", ""), t.detach()))
    return out


def _merged_model(pm):
    import copy

    return copy.deepcopy(pm).merge_and_unload().eval()


if __name__ == "__main__":
    main()
