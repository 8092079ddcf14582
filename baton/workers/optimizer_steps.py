"""One trainer step's optimizer steps, written once for every trainable role (actor, DPO
actor, critic).

`OptimizerSteps.run` takes a step's rows through `epochs` passes, each a seeded shuffle cut
into mini-batches (one optimizer step each) cut into micro-batches (one forward/backward
each, gradients accumulated), and around that does what every role must do alike:

- the seed of each pass: `step_seed(seed, version, epoch)`, so a resumed run shuffles as
  the uninterrupted one did;
- `zero_grad`, backward of the role's loss, the gradient sync over data ranks, the loss
  summed over ranks (each rank's loss is its share of the global one: losses are divided
  by global normalisers, which the role's `prepare` all-reduces once per mini-batch);
- clipping by the global gradient norm (`prefix/grad_norm`: mean over optimizer steps,
  before clipping);
- the non-finite guard: a non-finite loss or gradient norm skips the optimizer step and
  frees the gradients (`prefix/nonfinite_skipped` counts them; the same verdict on every
  rank, both values being all-reduced; the drivers stop after K such steps);
- one LR-schedule step per trainer step (`prefix/lr`: the LR after it);
- `offload`: the optimizer state comes to the device for the update and goes back to the
  CPU after it, with the gradients freed (the rollout phase holds neither).

The role supplies the shuffle, `prepare(mini_batch)` (its global normalisers) and
`loss(micro_batch, prepared) -> scalar` (collecting its own metrics on the way), and bumps
its version after `run`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from baton.algos import loss_normalisers
from baton.batch import Batch
from baton.models.parallel import move_optimizer_state


def step_seed(seed: int, version: int, epoch: int) -> int:
    """The shuffle seed of pass `epoch` of trainer step `version` (every role the same)."""
    return seed * 1_000_003 + version * 101 + epoch


@dataclass
class OptimizerSteps:
    """optim / sched: the role's (`baton.workers.optim.build_optimizer`); par: its
    `baton.models.parallel.Parallel` (all-reduce, grad sync, clipping); prefix: the metric
    prefix ("actor", "critic"); loss_key: the loss metric's name under it."""
    optim: torch.optim.Optimizer
    sched: Any
    par: Any
    device: torch.device
    grad_clip: float
    offload: bool = False
    prefix: str = "actor"
    loss_key: str = "loss"

    def global_counts(self, response_mask: torch.Tensor) -> tuple[float, float]:
        """(tokens, sequences) of a mini-batch over all data ranks: the normalisers of a
        token- or sequence-averaged loss (`baton.algos.loss_normalisers`)."""
        counts = self.par.all_reduce(torch.stack(loss_normalisers(response_mask)).double())
        return counts[0].item(), counts[1].item()

    def run(self, batch: Batch, *, epochs: int, mini: int, micro: int, seed: int, version: int,
            shuffle: Callable[[Batch, int], Batch], prepare: Callable[[Batch], Any],
            loss: Callable[[Batch, Any], torch.Tensor]) -> tuple[dict[str, float], int]:
        """Returns (metrics: loss, grad_norm, lr, nonfinite_skipped under `prefix/`, and the
        number of optimizer steps taken or skipped). mini / micro: this rank's rows per
        optimizer step / per forward-backward."""
        p = self.prefix
        if self.offload:
            move_optimizer_state(self.optim, self.device)
        loss_sum = norm_sum = 0.0
        n_steps = skipped = 0
        for epoch in range(epochs):
            for mb in shuffle(batch, step_seed(seed, version, epoch)).minibatches(mini, shuffle=False):
                ctx = prepare(mb)
                self.optim.zero_grad(set_to_none=True)
                mb_loss = torch.zeros((), dtype=torch.float64)
                for mc in mb.minibatches(micro, shuffle=False):
                    value = loss(mc, ctx)
                    value.backward()
                    mb_loss += value.item()
                self.par.sync_grads()  # SUM over data ranks: losses use global normalisers
                total = self.par.all_reduce(mb_loss).item()  # each rank's share: sum
                norm = float(self.par.clip_grad_norm_(self.grad_clip))  # global, before clipping
                loss_sum, norm_sum, n_steps = loss_sum + total, norm_sum + norm, n_steps + 1
                if math.isfinite(total) and math.isfinite(norm):
                    self.optim.step()
                else:  # never step on NaN / inf: it would poison the weights and every checkpoint
                    self.optim.zero_grad(set_to_none=True)
                    skipped += 1
        self.sched.step()
        if self.offload:
            self.optim.zero_grad(set_to_none=True)
            move_optimizer_state(self.optim, "cpu")
        n = max(n_steps, 1)
        return {f"{p}/{self.loss_key}": loss_sum / n, f"{p}/grad_norm": norm_sum / n,
                f"{p}/lr": self.optim.param_groups[0]["lr"], f"{p}/nonfinite_skipped": float(skipped)}, n_steps
