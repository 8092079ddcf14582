"""Which torch.distributed backend a weight broadcast uses, from where its ends' tensors live.

    choose_backend(End("cuda", "GPU-a"), [End("cuda", "GPU-b")])   -> "nccl"
    choose_backend(End("cuda", "GPU-a"), [End("cuda", "GPU-a")])   -> "gloo" (one GPU: via the host)
    choose_backend(End("cpu"), [End("cuda", "GPU-b")])             -> "gloo"

NCCL runs only between distinct GPUs: it refuses two ranks on one device (the trainer and a
`baton serve` on the same GPU, as `baton launch` places them on a one-GPU machine) and it
cannot send CPU tensors (a CPU actor on a GPU machine). Every other case goes over gloo,
whose buffers are on the CPU (`baton.sync.group`): each end copies its tensors through the
host, which works wherever the ends are. An end whose GPU is not known (a server that does
not say) counts as unknown: gloo. Asking for NCCL where it cannot run is one line naming
the fix. An end's GPU is named by something that is the same in every process (the
device's UUID, or the pool slot that owns it), never by its index: each process of a Ray
pool sees its own GPU as cuda:0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class End:
    """Where one end's tensors live: `kind` "cpu" or "cuda" (else: unknown); `gpu`: a name of
    that physical GPU, the same in every process (None: not known)."""
    kind: str
    gpu: str | None = None


def end_of(device: torch.device | str | None) -> End:
    """The `End` of tensors on `device` in this process (a CUDA device named by its UUID)."""
    if device is None:
        return End("unknown")
    device = torch.device(device)
    if device.type != "cuda":
        return End(device.type)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return End("cuda", str(torch.cuda.get_device_properties(index).uuid))


def choose_backend(sender: End, receivers: Sequence[End], requested: str | None = None) -> str:
    """"nccl" when every end is a known GPU and no two share one, else "gloo"; `requested`
    ("nccl" / "gloo"): used as given where it can run (nccl where it cannot: ValueError)."""
    ends = [sender, *receivers]
    gpus = [e.gpu for e in ends if e.kind == "cuda"]
    distinct = len(gpus) == len(ends) and None not in gpus and len(set(gpus)) == len(gpus)
    if requested == "gloo" or (requested is None and not distinct):
        return "gloo"
    if requested not in (None, "nccl"):
        raise ValueError(f"weight broadcast backend must be 'nccl' or 'gloo', got {requested!r}")
    if not distinct:
        where = ", ".join(e.kind if e.kind != "cuda" else f"cuda {e.gpu or '(GPU not known)'}" for e in ends)
        raise ValueError(f"weight broadcast over nccl needs each end on a GPU of its own (ends: {where}); "
                         f"use backend gloo (the default picks it), or serve on another GPU (--device cuda:N)")
    return "nccl"
