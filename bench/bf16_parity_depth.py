"""The engine's bf16 copy vs the trainer's bf16 autocast, by depth: how far apart their
logprobs drift (what `trainer.check_weight_sync`'s bf16 tolerance must allow).

On a GPU the colocated engine samples from a bf16 copy of the weights (bf16 residual stream),
while the trainer keeps fp32 master weights under bf16 autocast (fp32 residual stream), so
the two round differently and the difference grows with depth. For each depth: random
Qwen2-shaped models (seeds 0..2, hidden --hidden, init std --init: larger = peakier logits,
the regime where rounding shows), the weight-sync parity check itself
(`baton.sync.check_logprob_parity`: 8 greedy tokens after a 24-token prompt), max over seeds.

With --ref REV, a second column: the engine with the fast runner (`llama.py`) as it is at
git revision REV, on the same models (before / after a change to the runner's arithmetic).

    .venv/bin/python bench/bf16_parity_depth.py [--hidden 128] [--init 0.1] [--layers 2,4,8,16,24,32] [--ref main]
"""

from __future__ import annotations

import argparse

import torch

from _common import add_smoke, module_at
from baton.models.load import build_like
from baton.models.tiny import build_tiny_model
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.sync.base import check_logprob_parity
from baton.trainers.report.step_metrics import bf16_sync_tolerance


def mismatch(layers: int, hidden: int, init: float, seed: int, device: str, runner_cls=None) -> float:
    model = build_tiny_model(None, hidden=hidden, layers=layers, heads=4, kv_heads=2, intermediate=3 * hidden,
                             seed=seed, initializer_range=init).to(device).eval()
    copy = build_like(model, device, torch.bfloat16)
    copy.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    with torch.no_grad(), torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        engine = EmbeddedEngine(copy)
        if runner_cls is not None:  # --ref: the runner at another revision
            engine.runner = runner_cls(copy)
        return check_logprob_parity(engine, model, list(range(5, 29)), max_new_tokens=8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--init", type=float, default=0.1)
    ap.add_argument("--layers", default="2,4,8,16,24,32")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ref", default=None, help="also measure the engine with llama.py at this git revision")
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.layers, args.seeds, args.hidden = "2", 1, 32
    torch.set_num_threads(1)
    print(f"hidden {args.hidden}, init std {args.init}, {args.seeds} seeds, {args.device}")
    old = module_at(args.ref, "baton/rollout/embedded/llama.py", "llama_at_ref").LlamaRunner if args.ref else None
    ref_col = f" {'at ' + args.ref:>12}" if old else ""
    print(f"{'layers':>6} {'max |engine - trainer|':>24}{ref_col} {'tolerance':>10}")
    for layers in (int(x) for x in args.layers.split(",")):
        worst = max(mismatch(layers, args.hidden, args.init, s, args.device) for s in range(args.seeds))
        at_ref = (f" {max(mismatch(layers, args.hidden, args.init, s, args.device, old) for s in range(args.seeds)):>12.4f}"
                  if old else "")
        print(f"{layers:>6} {worst:>24.4f}{at_ref} {bf16_sync_tolerance(layers):>10.3f}", flush=True)


if __name__ == "__main__":
    main()
