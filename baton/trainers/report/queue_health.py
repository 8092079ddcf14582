"""Queue health: where an RL run's time goes between the generator and the trainer.

Every step of the PPO-family driver logs (`QueueHealth.step`; the wall-clock figures under
`throughput/`, with tokens/s, which comparisons of runs leave out):
    throughput/rows_trained_per_s    rows the step trained / the step's wall time (its phases)
    throughput/rows_generated_per_s  rows / the generator's own time on them (F.GENERATE_S,
                                     stamped by the rollout worker on the rows' meta: in the
                                     driver's process or a generator's of its own)
    throughput/trainer_idle          the share of the step the update was not running (the
                                     trainer waiting for rows: generation, scoring, the sync)
    throughput/generator_idle        the share of the step the generator was not generating
    queue/age_counts                 trained rows per policy age (0: sampled by the weights
                                     being trained; k: k versions behind), a histogram in
                                     report.png
    throughput/update_matmul_share   the update's FLOPs (6 x params x tokens x epochs) per
                                     second of it, over the machine's matmul rate
                                     (`matmul_rate`, measured once, raised to what
                                     the update reaches if that is more: at most 1)
and `summary(rows)` names the bottleneck at the end of the run ("the trainer waited 40% of the
time for rows: generation is the bottleneck").
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import torch

from baton import fields as F

PHASES = ("timing/rollout_s", "timing/score_s", "timing/update_s", "timing/sync_s")  # a step's work


@functools.lru_cache(maxsize=16)
def matmul_rate(device: str = "cpu", threads: int = 1, size: int = 512, seconds: float = 0.1) -> float:
    """FLOP/s of one square matmul of `size` on `device` (fp32 on the CPU with `threads`
    threads, bf16 on a GPU), timed for about `seconds`; once a process (a property of the
    machine, a rough one: runs in one process reuse it)."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        a @ a  # warm up
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ a
            n += 1
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return 2 * size ** 3 * n / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)


def age_counts(ages: torch.Tensor) -> list[int]:
    """Rows per integer policy age 0..max."""
    ages = ages.round().long().clamp(min=0)
    return torch.bincount(ages).tolist() if len(ages) else []


class QueueHealth:
    """Per-step queue metrics of a run (module doc). `params`: the policy's parameters;
    `rate`: the FLOP/s the update's processes could reach together; `epochs`: passes of the
    update over each batch."""

    def __init__(self, params: int, rate: float, epochs: int = 1) -> None:
        self.params, self.rate, self.epochs = params, rate, epochs

    def step(self, batch: Any, times: dict[str, float], version: int) -> dict[str, Any]:
        step_s = sum(times.get(k, 0.0) for k in PHASES)
        update_s = times.get("timing/update_s", 0.0)
        rows = len(batch)
        out: dict[str, Any] = {}
        if step_s > 0:
            out["throughput/rows_trained_per_s"] = rows / step_s
            out["throughput/trainer_idle"] = max(0.0, 1.0 - update_s / step_s)
        gen_s = batch.meta.get(F.GENERATE_S)
        if gen_s and step_s > 0:
            out["throughput/rows_generated_per_s"] = rows / gen_s
            out["throughput/generator_idle"] = max(0.0, 1.0 - gen_s / step_s)
        if F.POLICY_VERSION in batch:
            out["queue/age_counts"] = age_counts(version - batch[F.POLICY_VERSION].float())
        tokens = batch[F.RESPONSE_MASK].sum().item() + (batch[F.PROMPT_MASK].sum().item()
                                                          if F.PROMPT_MASK in batch.tensors else 0)
        if update_s > 0 and self.rate > 0:
            flops = 6 * self.params * tokens * self.epochs / update_s  # FLOP/s the update reached
            # the start's measurement may have caught a busy moment: the machine's rate is at least
            # what the update itself reached, so the share never reads above 1
            self.rate = max(self.rate, flops)
            out["throughput/update_matmul_share"] = flops / self.rate
        return out


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def summary(rows: list[dict[str, Any]]) -> str:
    """One line naming the bottleneck from a run's metrics ("" without queue metrics)."""
    trainer, generator = _median(rows, "throughput/trainer_idle"), _median(rows, "throughput/generator_idle")
    if trainer is None:
        return ""
    trained = _median(rows, "throughput/rows_trained_per_s")
    generated = _median(rows, "throughput/rows_generated_per_s")
    share = _median(rows, "throughput/update_matmul_share")
    ages = [0] * max((len(r["queue/age_counts"]) for r in rows if r.get("queue/age_counts")), default=0)
    for r in rows:
        for age, n in enumerate(r.get("queue/age_counts") or []):
            ages[age] += n
    mean_age = sum(a * n for a, n in enumerate(ages)) / sum(ages) if sum(ages) else 0.0
    if generator is None or trainer >= generator:
        verdict = f"the trainer waited {trainer:.0%} of the time for rows: generation is the bottleneck"
    else:
        verdict = f"the generator waited {generator:.0%} of the time for the trainer: the update is the bottleneck"
    rates = f"{trained:.1f} rows/s trained" + (f", {generated:.1f} rows/s generated" if generated else "")
    used = f", the update at {share:.0%} of the machine's matmul rate" if share is not None else ""
    return f"queue: {verdict} ({rates}; trained rows {mean_age:.2f} versions old on average{used})"
