"""Routing replay on a tiny mixture of experts: the engine/trainer mismatch with and without it.

The engine samples from a bf16 copy while the trainer computes in fp32 weights under bf16
autocast (`actor.bf16=true`, on the CPU as on a GPU), so the two can route a token to different
experts. Three GRPO runs of --steps steps on the arithmetic recipe, each from a random tiny
model (init std --init): a dense model of the same width (hidden 64, 2 layers), the Qwen3-MoE
preset without routing replay, and with it. Per run, the mean over steps of
`rollout/logprob_mismatch_kl` (engine vs trainer logprobs of the sampled tokens) and, with replay,
`rollout/routing_mismatch` (the share of the replayed token x layer decisions the trainer's own
router would have made otherwise: what replay removes).

    .venv/bin/python bench/moe_routing_replay.py [--steps 50] [--init 0.1]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _common import add_smoke

RUN = ["data.prompts_per_step=8", "rollout.n=4", "rollout.max_new_tokens=16", "data.eval_size=2",
       "actor.mini_batch_size=0", "actor.micro_batch_size=32", "trainer.eval_every=0", "trainer.save_every=0",
       "trainer.progress=false", "actor.bf16=true", "actor.lr=1e-4"]


def run(model: str, run_dir: Path, steps: int, extra: list[str], smoke: bool) -> dict[str, float]:
    from baton.cli import main

    sizes = ["data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4"] if smoke else []
    code = main(["train", "recipes/grpo_arithmetic.yaml", f"model.path={model}", *RUN, *sizes, *extra,
                 f"trainer.run_dir={run_dir}", f"trainer.steps={steps}"])
    assert code == 0, code
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lines = [r for r in lines if "actor/loss" in r]
    out = {}
    for key in ("rollout/logprob_mismatch_kl", "rollout/routing_mismatch", "actor/ratio_mean"):
        values = [r[key] for r in lines if key in r]
        if values:
            out[key] = sum(values) / len(values)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--init", type=float, default=0.1, help="the random models' init std (peakier routing and logits)")
    add_smoke(ap)
    args = ap.parse_args()
    steps = 2 if args.smoke else args.steps
    from baton.models.make import make_tiny_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="bench-moe-replay-"))
    dense = make_tiny_checkpoint(tmp / "dense", preset="0.2m", layers=2, intermediate=128, initializer_range=args.init)
    moe = make_tiny_checkpoint(tmp / "moe", preset="qwen3-moe", initializer_range=args.init)
    rows = {"dense (hidden 64, 2 layers)": run(str(dense), tmp / "r-dense", steps, [], args.smoke),
            "qwen3-moe, no replay": run(str(moe), tmp / "r-moe", steps, [], args.smoke),
            "qwen3-moe, routing replay": run(str(moe), tmp / "r-replay", steps, ["rollout.routing_replay=true"], args.smoke)}
    print(f"\n{steps} GRPO steps, engine bf16 / trainer fp32 weights under bf16 autocast, init std {args.init}")
    print(f"{'run':<28} {'logprob_mismatch_kl':>20} {'routing_mismatch':>17} {'ratio_mean':>11}")
    for name, m in rows.items():
        routing = m.get("rollout/routing_mismatch")
        print(f"{name:<28} {m['rollout/logprob_mismatch_kl']:>20.3e} "
              f"{'-' if routing is None else f'{routing:.4f}':>17} {m['actor/ratio_mean']:>11.6f}")


if __name__ == "__main__":
    main()
