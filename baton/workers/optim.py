"""Optimizer and learning-rate schedule for the trainable roles (actor, critic, SFT)."""

from __future__ import annotations

import math

import torch


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str,
              min_ratio: float = 0.0) -> float:
    """Multiplier of the base LR at optimizer-schedule step `step` (0-based).

    Linear warm-up over `warmup_steps`, then constant, cosine or linear decay to `min_ratio`.
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        return min_ratio + (1 - min_ratio) * (1 - progress)
    raise ValueError(f"unknown lr schedule {schedule!r}; use constant, cosine or linear")


def build_optimizer(model: torch.nn.Module, *, lr: float, weight_decay: float,
                    betas: tuple[float, float], warmup_steps: int, total_steps: int,
                    schedule: str, min_ratio: float = 0.0
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    # fused: one kernel for all parameters (CPU and CUDA); tiny models are dispatch-bound.
    optim = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=tuple(betas), fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: lr_factor(
        s, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule, min_ratio=min_ratio))
    return optim, sched
