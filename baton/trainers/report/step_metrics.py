"""What an RL step logs about its rows and its update, and the weight-sync parity check:
shared by the PPO-family driver and online DPO."""

from __future__ import annotations

from typing import Any

from baton import fields as F
from baton.batch import Batch
from baton.rows import spanning_versions


def step_metrics(batch: Batch, update: list[dict[str, float]], version: int) -> dict[str, Any]:
    """Rewards, lengths, policy age (`version`: the trainer's weights version that trains on
    these rows) and the update's metrics (means over data-parallel ranks)."""
    rewards, mask = batch[F.REWARDS], batch[F.RESPONSE_MASK].float()
    lengths = mask.sum(1)
    m: dict[str, Any] = {
        "reward/mean": rewards.mean().item(), "reward/std": rewards.std().item(),
        "response/length_mean": lengths.mean().item(),
        "response/truncated": sum(r == "length" for r in batch[F.FINISH_REASON]) / len(batch),
        "rollout/policy_age": (version - batch[F.POLICY_VERSION].float()).mean().item(),
        "rollout/tokens": int(lengths.sum().item()),
        # rows whose tokens were sampled by more than one weight version (an agent's or a
        # gateway session's turns across a weight update): `baton.rows`
        "rollout/rows_spanning_versions": spanning_versions(batch),
    }
    if F.PROMPT_MASK in batch.tensors:  # with rollout/tokens: the step's work (bench/grpo_vs_trl.py's FLOPs)
        m["rollout/prompt_tokens"] = int(batch[F.PROMPT_MASK].sum().item())
    for k in batch.tensors:
        if k.startswith("reward/"):
            m[k] = batch[k].mean().item()
    for k in batch.tensors:  # reward calls that raised / hung / were not finite (scored 0)
        if k.startswith("reward_"):
            m[f"reward/{k.removeprefix('reward_')}"] = int(batch[k].sum())
    for k in update[0]:
        m[k] = sum(u[k] for u in update) / len(update)
    return name_mismatch(m)


MISMATCH = "rollout/logprob_mismatch_kl"  # engine vs trainer at the same weights: their numerics
BEHAVIOUR = "rollout/behaviour_kl"  # the rows' sampler (older weights) vs the trainer now: lag + numerics


def name_mismatch(m: dict[str, Any]) -> dict[str, Any]:
    """The update's engine-vs-trainer KL (`MISMATCH`) is the engine's numerics only when the
    rows are on-policy; rows sampled by older weights (a generator ahead, the trajectory API)
    add the policy's change since, so there the figure is logged as `BEHAVIOUR` instead, and
    the engine's own parity is the weight-sync check's (trainer.check_weight_sync)."""
    if MISMATCH in m and m.get("rollout/policy_age", 0.0) > 0:
        m[BEHAVIOUR] = m.pop(MISMATCH)
    return m


FP32_SYNC_TOL = 1e-4  # max |engine - trainer| logprob on the probe, fp32 on both sides


def bf16_sync_tolerance(layers: int) -> float:
    """The bound for a bf16 engine copy vs the trainer's bf16 autocast, which drift apart with
    depth (the copy's residual stream is bf16, the trainer's fp32): 0.04 * sqrt(layers), at
    least 0.1. Measured (BENCHMARKS.md, bench/bf16_parity_depth.py): on an H200, random
    Qwen2.5 shapes, 0.047 at 24 layers (0.5B), 0.090 at 28 (1.5B); on the CPU, peaky random
    models (init 0.1), up to 0.19 at 24-32 layers. 24 layers: 0.196; 28: 0.21; 80: 0.36, still
    far below what wrong weights give (a sync that missed a step differs by the step's change)."""
    return max(0.1, 0.04 * layers ** 0.5)


def sync_tolerance(cfg: Any) -> float:
    """The parity check's bound for a run's precision (bf16 where the actor computes in it:
    `actor.bf16`, None = on GPUs or with `model.dtype=bfloat16`; its bound grows with the
    model's depth, read from its config.json)."""
    import json
    from pathlib import Path

    from baton.models.precision import resolve_bf16

    device = "cuda" if cfg.placement.gpus_per_worker else "cpu"
    if not resolve_bf16(cfg.actor.bf16, device, cfg.model.torch_dtype):
        return FP32_SYNC_TOL
    config = json.loads((Path(cfg.model.path) / "config.json").read_text())
    return bf16_sync_tolerance(int(config.get("num_hidden_layers", 1)))


def check_sync(parity: list[float] | None, step: int, tol: float = FP32_SYNC_TOL) -> None:
    """Fail loudly if an engine samples from weights other than the trainer's."""
    if parity and max(parity) > tol:
        raise RuntimeError(f"weight sync check failed after step {step}: engine and trainer "
                           f"logprobs differ by {max(parity):.2e} (> {tol:g}) on a fixed prompt")
