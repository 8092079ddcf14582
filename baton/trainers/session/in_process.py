"""Training one model in the driver's own process (SFT, reward models), inside the same run
session as every other driver: lock, resume, metrics, evaluation, atomic checkpoints.

    with RunSession(cfg) as run:
        model, tokenizer = ...; optim, sched = build_optimizer(...)
        result = fit(run, cfg.optim.grad_clip, model, tokenizer, optim, sched, state, loss_fn, evaluate,
                     prefix="sft", evaluate_at_start=False)

The model sits on `trainer.device` (`place`: auto = the GPU when there is one) and computes
in bf16 autocast there (`trainer.bf16`, fp32 master weights; the CPU default is fp32).
Each step takes `trainer.batch_size` rows from the run's resumable sampler and makes one
optimizer step on `loss_fn(model, rows) -> (loss, stats)`: clipped to `optim.grad_clip`,
skipped (and counted by the non-finite guard) when the loss or the gradient norm is not
finite. A checkpoint (`checkpoints/step_N`) is an HF directory (model + tokenizer, loadable
as it is) plus `trainer_state.pt` (optimizer, schedule, sampler, step); `trainer.resume=auto`
continues from it exactly. With `trainer.save_path`, the final model is also exported there
(nothing is exported by default: shipped checkpoints are never a default output).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from baton.models import save_pretrained
from baton.controller.devices import enable_tf32
from baton.models.precision import autocast, pick_device, resolve_bf16
from baton.runs.checkpoints import CHECKPOINTS_DIR
from baton.trainers.session.run import NonFiniteGuard, RunSession, prune_checkpoints
from baton.trainers.session.config import TrainerConfig

TRAINER_STATE = "trainer_state.pt"


@dataclass
class InProcessTrainerConfig(TrainerConfig):
    """The `trainer:` section of SFT and reward-model runs: TrainerConfig plus the batch,
    the torch threads, and where (if anywhere) to export the final model."""
    batch_size: int = 64  # rows (SFT) or pairs (RM) per optimizer step
    num_threads: int = 1  # torch intra-op threads (0: torch's default); 1 is faster on a shared box
    save_path: str | None = None  # export the final model here too (HF dir); None: only the run dir
    save_dtype: Literal["float32", "bfloat16"] = "float32"  # of the export
    device: str = "auto"  # auto (cuda when CUDA is available, else cpu) | cpu | cuda | cuda:N
    bf16: bool | None = None  # bf16 autocast, fp32 master weights; None: on CUDA yes, on the CPU no

    def check(self) -> None:
        super().check()
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"trainer.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.batch_size < 1 or self.num_threads < 0:
            raise ValueError(f"trainer.batch_size must be >= 1 and trainer.num_threads >= 0 "
                             f"(got {self.batch_size}, {self.num_threads})")


def place(model: Any, t: InProcessTrainerConfig) -> Any:
    """`model` on the run's device (`trainer.device`), TF32 on for CUDA; before the
    optimizer is built, so its state lives there too."""
    device = pick_device(t.device)
    enable_tf32(device)
    return model.to(device)


def save_state(path: Path, model: Any, tokenizer: Any, optim: Any, sched: Any, driver: dict[str, Any]) -> None:
    state = {"optim": optim.state_dict(), "sched": sched.state_dict(), "driver": driver}
    save_pretrained(model, tokenizer, path, extra=lambda tmp: torch.save(state, tmp / TRAINER_STATE))


def load_state(path: str, model: Any, optim: Any, sched: Any) -> dict[str, Any]:
    """Load a checkpoint's weights, optimizer and schedule; return the driver state."""
    model.load_state_dict(type(model).from_pretrained(path).state_dict())
    state = torch.load(Path(path) / TRAINER_STATE, weights_only=False, map_location="cpu")  # a GPU run's too
    optim.load_state_dict(state["optim"])
    sched.load_state_dict(state["sched"])
    return state["driver"]


def fit(run: RunSession, grad_clip: float, model: Any, tokenizer: Any, optim: Any, sched: Any, state: Any,
        loss_fn: Callable[[Any, list], tuple[torch.Tensor, dict[str, float]]],
        evaluate: Callable[[], dict[str, float]] | None, *, prefix: str, evaluate_at_start: bool) -> dict[str, Any]:
    """Run the session's steps (see the module docstring); returns the losses of this
    process's steps and the session's result (start/eval/*, eval/*)."""
    t: InProcessTrainerConfig = run.t
    if t.num_threads > 0:
        torch.set_num_threads(t.num_threads)

    class Guard(NonFiniteGuard):
        KEYS = (f"{prefix}/loss", f"{prefix}/grad_norm")

    def restore(path: str) -> None:
        state.restore(load_state(path, model, optim, sched))

    def checkpoint(step: int) -> None:
        save_state(run.path / CHECKPOINTS_DIR / f"step_{step}", model, tokenizer, optim, sched, state.to_dict())
        prune_checkpoints(run.path, t.keep_checkpoints)

    def evaluation() -> dict[str, float]:
        model.eval()
        try:
            return evaluate()
        finally:
            model.train()

    device = next(model.parameters()).device  # `place` put it there
    bf16 = resolve_bf16(t.bf16, device)
    run.start(state, restore=restore, evaluate=evaluation if evaluate else None,
              guard=Guard(t.max_nonfinite_steps), evaluate_at_start=evaluate_at_start)
    model.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    for step, timed in run.steps():
        lr = optim.param_groups[0]["lr"]  # this step's (the schedule moves after the step)
        with timed("update"):
            with autocast(device, bf16):  # the loss functions return fp32 losses
                loss, stats = loss_fn(model, state.sampler.next_batch(t.batch_size))
            optim.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip).item()
            skipped = not (math.isfinite(loss.item()) and math.isfinite(grad_norm))
            if not skipped:  # a non-finite step leaves the weights as they were
                optim.step()
            sched.step()
        losses.append(loss.item())
        metrics = {f"{prefix}/loss": loss.item(), f"{prefix}/lr": lr, f"{prefix}/grad_norm": grad_norm,
                   **{f"{prefix}/{k}": v for k, v in stats.items()}, "actor/nonfinite_skipped": int(skipped)}
        run.end_step(step, metrics, save=lambda: checkpoint(step))
    out: dict[str, Any] = {**run.result(), "losses": losses, "train_s": time.perf_counter() - t0}
    if losses:
        out.update(loss_first=losses[0], loss_last=losses[-1])
    if t.save_path:
        model.eval()
        export = model.to(torch.bfloat16) if t.save_dtype == "bfloat16" else model
        out["save_path"] = str(save_pretrained(export, tokenizer, t.save_path))
        print(f"{prefix}: exported the final model to {out['save_path']}")
    return out
