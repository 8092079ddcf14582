"""What an RL step logs about its rows and its update, and the weight-sync parity check:
shared by the PPO-family driver and online DPO."""

from __future__ import annotations

from typing import Any

from baton import fields as F
from baton.batch import Batch


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
    return m


def check_sync(parity: list[float] | None, step: int, tol: float = 1e-4) -> None:
    """Fail loudly if an engine samples from weights other than the trainer's."""
    if parity and max(parity) > tol:
        raise RuntimeError(f"weight sync check failed after step {step}: engine and trainer "
                           f"logprobs differ by {max(parity):.2e} (> {tol:g}) on a fixed prompt")
