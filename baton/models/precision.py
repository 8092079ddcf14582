"""Precision and device defaults of the roles (docs/ARCHITECTURE.md, "Precision and devices").

On a GPU: fp32 master weights and optimizer state, bf16 autocast for the forward and
backward, TF32 for whatever matmuls stay fp32 (`baton.controller.devices.enable_tf32`, set
where a slot's CUDA device is set up); logprobs and losses are accumulated in fp32
(`baton.algos.linear_logprobs`, `upcast`). On the CPU: fp32 throughout (bf16 autocast on a
CPU without bf16 units is slower, and fp32 keeps the CPU runs bit for bit reproducible).
A role's `bf16` key is `None` by default, meaning "yes on CUDA, no elsewhere"; an explicit
true / false wins. `model.dtype=bfloat16` keeps fp32 master weights in the trained roles
and computes in bf16 (`master_dtype`); the frozen ones (reference, teacher, a LoRA base)
hold bf16 weights, and on a GPU they do so by default too (`weights_dtype`).

Peak memory per phase (`memory_phase("rollout")`, `memory_metrics()`): CUDA only, a no-op
elsewhere; the phases of one process (colocated roles) are reported together by the actor's
update as `memory/peak_gib_<phase>`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_PEAKS: dict[str, float] = {}  # phase -> peak GiB since the last memory_metrics()


def pick_device(name: str) -> torch.device:
    """A device setting made concrete: "auto" -> cuda (the current GPU) when CUDA is
    available, else cpu; "cpu" / "cuda" / "cuda:N" as given."""
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(name)


def resolve_bf16(flag: bool | None, device: torch.device | str, model_dtype: torch.dtype | None = None) -> bool:
    """A role's `bf16` setting made concrete: None -> True on CUDA or where the model's dtype
    (`model.dtype`) is bf16, False elsewhere."""
    if flag is not None:
        return bool(flag)
    return torch.device(device).type == "cuda" or model_dtype == torch.bfloat16


def master_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """The dtype a trained role (actor, critic) keeps its weights and AdamW state in:
    `model.dtype=bfloat16` gives fp32 master weights computing in bf16 (`resolve_bf16`), as
    `actor.bf16` does: a bf16 weight drops any update under 1/256 of itself, so AdamW's
    small steps would round away. fp32 / fp64 stay as given; frozen roles load model.dtype."""
    return torch.float32 if model_dtype in (torch.bfloat16, torch.float16) else model_dtype


def weights_dtype(device_type: str, role: str, model_dtype: torch.dtype, bf16: bool) -> torch.dtype:
    """The dtype a role holds its weights in, from the device type ("cuda", "cpu"), the role
    ("trained": actor, critic; "frozen": reference, teacher, a LoRA base), `model.dtype` and
    the role's bf16 setting made concrete (`resolve_bf16`).

    trained: `master_dtype` (fp32 for bf16 / fp16, else as given), on every device.
    frozen: bf16 on a GPU where the role computes in bf16 and model.dtype is the default
    float32 (its matmuls run in bf16 under autocast anyway: fp32 weights would double the
    memory and the weight reads for nothing); elsewhere model.dtype as given (fp32 on the
    CPU unless asked)."""
    if role == "trained":
        return master_dtype(model_dtype)
    if role != "frozen":
        raise ValueError(f"weights_dtype: role is 'trained' or 'frozen', got {role!r}")
    if device_type == "cuda" and bf16 and model_dtype == torch.float32:
        return torch.bfloat16
    return model_dtype


def compute_dtype(bf16: bool) -> torch.dtype | None:
    """The dtype a role computes in under autocast (None: its weights' own)."""
    return torch.bfloat16 if bf16 else None


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on `device`'s type (a no-op context when not enabled)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


@contextlib.contextmanager
def memory_phase(name: str, device: torch.device) -> Iterator[None]:
    """Record the peak CUDA memory allocated while the block runs as phase `name` (the peak
    counter is reset on entry). CPU: nothing is recorded."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.reset_peak_memory_stats(device)
    try:
        yield
    finally:
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        _PEAKS[name] = max(peak, _PEAKS.get(name, 0.0))


def memory_metrics() -> dict[str, float]:
    """{memory/peak_gib_<phase>: GiB} recorded in this process since the last call (emptied)."""
    out = {f"memory/peak_gib_{k}": v for k, v in _PEAKS.items()}
    _PEAKS.clear()
    return out
