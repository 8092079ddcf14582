"""One trainer step's optimizer steps, written once for every trainable role (actor, DPO
actor, critic).

`OptimizerSteps.run` takes a step's rows through `epochs` passes, each a seeded shuffle cut
into mini-batches (one optimizer step each) cut into micro-batches (one forward/backward
each, gradients accumulated), and around that does what every role must do alike:

- the seed of each pass: `step_seed(seed, version, epoch)`, so a resumed run shuffles as
  the uninterrupted one did;
- `zero_grad`, backward of the role's loss, the gradient sync over data ranks, the loss
  summed over ranks (each rank's loss is its share of the global one: losses are divided
  by global normalisers, `global_counts`, which the role's `prepare` asks for);
- few collectives (each one a point where every rank waits for the slowest): the
  normalisers of every mini-batch of a pass are all-reduced together at the pass's first
  `global_counts`; an optimizer step's only collective is the gradient all-reduce, which
  carries the step's finite-loss verdict as one extra element (`Parallel.sync_grads`); the
  loss metric is all-reduced once per `run` (fsdp2, whose gradients are reduced inside the
  backward, all-reduces the verdict on its own);
- clipping by the global gradient norm (`prefix/grad_norm`: mean over optimizer steps,
  before clipping);
- the non-finite guard: a non-finite loss or gradient norm skips the optimizer step and
  frees the gradients (`prefix/nonfinite_skipped` counts them; the same verdict on every
  rank, both values being all-reduced; the drivers stop after K such steps);
- one LR-schedule step per trainer step (`prefix/lr`: the LR after it);
- the gradients freed after the update (`zero_grad(set_to_none=True)`), offload or not: a
  colocated engine generates next and the next update's first `zero_grad` would drop them
  anyway (at 0.5B, 2 GB of fp32 gradients otherwise held through rollout);
- `offload`: the optimizer state comes to the device for the update and goes back to the
  CPU after it (into pinned buffers kept from one update to the next, `HostStash`), so the
  rollout phase holds neither.

The role supplies the shuffle, `prepare(mini_batch)` (its global normalisers) and
`loss(micro_batch, prepared) -> scalar` (collecting its own metrics on the way), and bumps
its version after `run`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from baton import fields as F
from baton.algos import loss_normalisers
from baton.batch import Batch
from baton.models.host_stash import HostStash
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

    def __post_init__(self) -> None:
        self._pass: list[torch.Tensor] = []  # response masks of the current pass's mini-batches
        self._pass_counts: torch.Tensor | None = None  # [n, 2] their global normalisers
        self._at = -1  # index of the current mini-batch in the pass
        self._stash = HostStash()  # offload: the optimizer state's host buffers, allocated once

    def global_counts(self, response_mask: torch.Tensor) -> tuple[float, float]:
        """(tokens, sequences) of a mini-batch over all data ranks: the normalisers of a
        token- or sequence-averaged loss (`baton.algos.loss_normalisers`).

        Asked inside `run` for the current mini-batch's mask, the first call of a pass
        all-reduces the normalisers of all the pass's mini-batches at once (one collective
        per pass, not one per optimizer step); any other mask: its own all-reduce."""
        if 0 <= self._at < len(self._pass) and response_mask is self._pass[self._at]:
            if self._pass_counts is None:
                local = torch.stack([torch.stack(loss_normalisers(m)).double() for m in self._pass])  # [n, 2]
                self._pass_counts = self.par.all_reduce(local)
            counts = self._pass_counts[self._at]
        else:
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
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # this rank's share, summed over steps
        norm_sum = 0.0
        n_steps = skipped = 0
        for epoch in range(epochs):
            mbs = list(shuffle(batch, step_seed(seed, version, epoch)).minibatches(mini, shuffle=False))
            self._pass, self._pass_counts = [mb[F.RESPONSE_MASK] for mb in mbs if F.RESPONSE_MASK in mb], None
            if len(self._pass) != len(mbs):
                self._pass = []
            for self._at, mb in enumerate(mbs):
                ctx = prepare(mb)
                self.optim.zero_grad(set_to_none=True)
                mb_loss = torch.zeros((), dtype=torch.float64, device=self.device)
                mcs = list(mb.minibatches(micro, shuffle=False))
                for i, mc in enumerate(mcs):
                    value = loss(mc, ctx)
                    mb_loss += value.detach().double()  # no .item() per micro-batch (a device sync)
                    if i == len(mcs) - 1:  # the step's last backward: its gradients sum while it runs
                        flag = finite_flag(mb_loss)
                        self.par.arm_grad_sync(flag)
                    value.backward()
                loss_sum += mb_loss
                finite_loss = all_finite(self.par, flag)  # with the gradients' SUM over data ranks
                norm = float(self.par.clip_grad_norm_(self.grad_clip))  # global, before clipping
                norm_sum, n_steps = norm_sum + norm, n_steps + 1
                if finite_loss and math.isfinite(norm):
                    self.optim.step()
                else:  # never step on NaN / inf: it would poison the weights and every checkpoint
                    self.optim.zero_grad(set_to_none=True)
                    skipped += 1
        self._pass, self._pass_counts, self._at = [], None, -1
        total = self.par.all_reduce(loss_sum).item()  # the ranks' shares of every step's loss
        self.sched.step()
        self.optim.zero_grad(set_to_none=True)  # the rollout that follows holds no gradients
        if self.offload:
            move_optimizer_state(self.optim, "cpu", self._stash)
        n = max(n_steps, 1)
        return {f"{p}/{self.loss_key}": total / n, f"{p}/grad_norm": norm_sum / n,
                f"{p}/lr": self.optim.param_groups[0]["lr"], f"{p}/nonfinite_skipped": float(skipped)}, n_steps


def finite_flag(local_loss: torch.Tensor) -> torch.Tensor:
    """[1] float64 on the loss's device: 0 where `local_loss` is finite, NaN where not (a
    sum over ranks is NaN when any rank's is); no device sync."""
    zero = torch.zeros(1, dtype=torch.float64, device=local_loss.device)
    return torch.where(torch.isfinite(local_loss), zero, torch.full_like(zero, math.nan))


def all_finite(par: Any, flag: torch.Tensor) -> bool:
    """Sums the gradients over the data ranks (`par.sync_grads`: the armed, overlapped
    all-reduce where one was armed) and says whether every rank's loss is finite, the same
    answer on every rank: the verdict (`finite_flag`) rides on the gradient all-reduce as
    one extra element; strategies without that all-reduce (fsdp2, one rank) all-reduce it
    alone."""
    verdict = par.sync_grads(extra=flag)
    if verdict is None:
        verdict = par.all_reduce(flag)
    return math.isfinite(verdict.item())
