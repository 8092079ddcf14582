"""Optimizer and learning-rate schedule for the trained roles (actor, critic, SFT, reward model).

`OptimConfig` is their one declaration of the optimizer settings (AdamW and its LR schedule):
the actor's and the critic's sections are `OptimConfig`s (the keys sit flat in `actor:` /
`critic:`), SFT's and the reward model's `optim:` sections are too. A role whose defaults
differ subclasses it and restates only those defaults (the config loader builds a section
from its class, so the defaults live on the class).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

Schedule = Literal["constant", "cosine", "linear"]


@dataclass
class OptimConfig:
    """AdamW and its LR schedule for one trained role (defaults: the actor's)."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    lr_warmup_steps: int = 0  # linear LR warm-up over this many updates
    lr_schedule: Schedule = "constant"  # after the warm-up: constant, or cosine / linear decay
    min_lr_ratio: float = 0.0  # the decay's floor, as a fraction of lr
    grad_clip: float = 1.0

    def check_optim(self, section: str) -> None:
        if self.lr <= 0 or self.grad_clip <= 0 or self.lr_warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"{section}: lr must be > 0, grad_clip > 0, lr_warmup_steps >= 0, min_lr_ratio in "
                             f"[0, 1] (got lr={self.lr}, grad_clip={self.grad_clip}, "
                             f"lr_warmup_steps={self.lr_warmup_steps}, min_lr_ratio={self.min_lr_ratio})")

    def build(self, model: torch.nn.Module, total_steps: int, **options: Any
              ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        """`build_optimizer` with these settings; `options`: its `no_decay_1d` / `fused`."""
        return build_optimizer(model, lr=self.lr, weight_decay=self.weight_decay, betas=tuple(self.betas),
                               warmup_steps=self.lr_warmup_steps, total_steps=total_steps,
                               schedule=self.lr_schedule, min_ratio=self.min_lr_ratio, **options)


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


def _split_by_layout(group: dict) -> list[dict]:
    """One param group per (plain | DTensor mesh + placements), in first-seen order."""
    from torch.distributed.tensor import DTensor

    parts: dict = {}
    for p in group["params"]:
        key = (id(p.device_mesh), tuple(p.placements)) if isinstance(p, DTensor) else None
        parts.setdefault(key, []).append(p)
    if len(parts) <= 1:
        return [group]
    return [{**group, "params": ps} for ps in parts.values()]


def build_optimizer(model: torch.nn.Module, *, lr: float, weight_decay: float,
                    betas: tuple[float, float], warmup_steps: int, total_steps: int,
                    schedule: str, min_ratio: float = 0.0, no_decay_1d: bool = False,
                    fused: bool = True
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters and its LR schedule (`lr_factor`; call
    `sched.step()` after each `optim.step()`).

    no_decay_1d: no weight decay on 1-d parameters (norm weights, biases). fused: one kernel
    for all parameters (CPU and CUDA), which tiny, dispatch-bound models want; False gives
    PyTorch's default implementation (whose last bits differ from the fused kernel's).
    Sharded modules (`baton.models.parallel`) mix plain and DTensor parameters on different
    meshes, which one fused / foreach kernel call cannot take: each group is then split by
    layout (a plain module keeps exactly the groups above)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if no_decay_1d:
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": weight_decay}]
    groups = [g for group in groups for g in _split_by_layout(group)]
    optim = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=True if fused else None)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: lr_factor(
        s, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule, min_ratio=min_ratio))
    return optim, sched
