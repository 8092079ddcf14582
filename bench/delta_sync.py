"""Delta sync: bytes and seconds per weight push, the whole model vs only what changed
(baton.sync.delta), for full fine-tuning, frozen embeddings and LoRA, on the broadcast and
checkpoint transports.

    .venv/bin/python bench/delta_sync.py [--size 25m] [--vocab 32000] [--reps 4] [--rank 8]

Trainer: a Qwen2-shaped model (preset `--size`, embeddings tied to the LM head) with a real
tokenizer's vocabulary (`--vocab`, Llama 2's 32,000 by default: the embedding's share of the
bytes is what frozen embeddings save; the presets' own 260-token vocabulary hides it). Each push
follows a stand-in optimizer step (noise added, untimed) on what the run trains:
  full fine-tuning    every parameter
  frozen embeddings   every parameter but model.embed_tokens.weight (the LM head with it)
  LoRA                the adapters (rank `--rank`, every linear of every layer); the push
                      carries the merged weights (`merged_weights`: what an engine without
                      LoRA loads), so the adapted linears change and the rest does not
Transports, into an engine in this process: broadcast (gloo over loopback, 64 MB buckets, a
`WeightReceiver`), checkpoint (a safetensors file in a temp dir, then loaded). Each runs with
delta=False (the whole model every push) and delta=True (the default), the first push of each
untimed (both send the whole model then). Per push: sync/bytes and sync/seconds as the
transport reports them (medians over --reps), digests (both modes: each receiver checks them)
included; after the last push the engine is checked to hold the trainer's weights byte for
byte (`held_exactly`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from baton.models.lora import LoraAdapterConfig, apply_lora, merged_weights
from baton.models.tiny import build_tiny_model
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.sync import BroadcastSync, CheckpointSync, WeightReceiver
from baton.sync.verify import held_exactly
from _common import add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

FROZEN = "embed_tokens"


def trainer_for(kind: str, size: str, rank: int, vocab: int) -> torch.nn.Module:
    model = build_tiny_model(size, vocab_size=vocab, seed=0).eval()
    return apply_lora(model, LoraAdapterConfig(rank=rank, alpha=2 * rank)).eval() if kind == "LoRA" else model


def step(model: torch.nn.Module, kind: str, g: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            trains = {"full fine-tuning": True, "frozen embeddings": FROZEN not in name, "LoRA": "lora_" in name}[kind]
            if trains:
                p.add_(torch.randn(p.shape, generator=g) * 1e-3)


def weights(model: torch.nn.Module, kind: str) -> list[tuple[str, torch.Tensor]]:
    return list(merged_weights(model)) if kind == "LoRA" else list(model.named_parameters())


def run(kind: str, transport: str, delta: bool, args, tmp: Path) -> tuple[float, float, int]:
    """(median bytes, median seconds, whole-model bytes) per push."""
    trainer = trainer_for(kind, args.size, args.rank, args.vocab)
    engine = EmbeddedEngine(build_tiny_model(args.size, vocab_size=args.vocab, seed=1).eval(), fuse_weights=False)
    if transport == "broadcast":
        sync = BroadcastSync([WeightReceiver(engine)], bucket_mb=64, timeout_s=120, delta=delta)
    else:
        sync = CheckpointSync([engine], directory=tmp / f"{kind}-{delta}".replace(" ", "_"), delta=delta)
    g = torch.Generator().manual_seed(0)
    got = []
    try:
        for version in range(args.reps + 1):
            step(trainer, kind, g)
            sync.push(weights(trainer, kind), version + 1)
            got.append((sync.last["sync/bytes"], sync.last["sync/seconds"]))
        named = weights(trainer, kind)
        assert held_exactly(dict(engine.model.named_parameters()), named) == (True, None), "engine != trainer"
    finally:
        sync.close()
    whole = sum(t.numel() * t.element_size() for _, t in named)
    return statistics.median(b for b, _ in got[1:]), statistics.median(s for _, s in got[1:]), whole


OPTIONS = {"size": "25m", "vocab": 32000, "reps": 4, "rank": 8, "threads": 1}  # --NAME, its default
SMOKE = {"size": "0.75m", "vocab": 260, "reps": 1}


def main() -> None:
    ap = argparse.ArgumentParser()
    for name, default in OPTIONS.items():
        ap.add_argument(f"--{name}", type=type(default), default=default)
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    print(f"model {args.size}, vocabulary {args.vocab}; medians over {args.reps} pushes; engine in this process\n")
    print("| run trains | transport | full: MB / push | full: s / push | delta: MB / push | delta: s / push "
          "| delta bytes |")
    print("|---|---|---|---|---|---|---|")
    for kind in ("full fine-tuning", "frozen embeddings", "LoRA"):
        for transport in ("broadcast", "checkpoint"):
            fb, fs, whole = run(kind, transport, False, args, tmp)
            db, ds, _ = run(kind, transport, True, args, tmp)
            assert fb == whole
            print(f"| {kind} | {transport} | {fb / 1e6:.1f} | {fs:.3f} | {db / 1e6:.1f} | {ds:.3f} "
                  f"| {100 * db / whole:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
