"""`sync/verified`: does the engine hold exactly the trainer's weights after a sync (issue 49)?

    held_exactly(engine_tensors, trainer_named)  -> (True, None) or (False, "first tensor that differs")

Tensor for tensor, by name: an engine tensor that *is* the trainer's (the same storage, shape,
strides and dtype: the `inplace` transport, where the engine reads the trainer's module) holds
its bytes by construction and is not read; any other (an engine's own copy: `copy`,
`checkpoint`) is compared byte for byte with the trainer's, cast to the engine's dtype first
(an engine sampling in bf16 from fp32 master weights holds the cast), where both live: what
equal digests (`baton.sync.digest`) would say, without hashing or a copy to the host (both
sides are in this process; digests are for what crosses a wire). A trainer tensor the engine
does not hold is a difference too. Cost: one read of each tensor on both sides for an own
copy, nothing for `inplace` (BENCHMARKS.md, "sync/verified").

Across a wire (the API path's `baton serve` processes) the two sides do not share a process:
the receiver reports what it holds (`held_report`: each tensor's dtype and digest, computed
from its model; the server's `/weights_digest`) and the sender compares that with the digests
of what it sent (`digests_held`).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from baton.sync.digest import digests
from baton.sync.group import dtype_name

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / torch.compile wrappers of trainer names


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`a` and `b` are views of the same bytes: the same storage, offset, shape, strides, dtype."""
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() == b.storage_offset())


def module_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{name: tensor} of a module's parameters and buffers, tied aliases included
    (`state_dict` keeps `lm_head.weight`, which `named_parameters` drops)."""
    table = dict(module.named_parameters())
    for name, t in module.state_dict(keep_vars=True).items():
        table.setdefault(name, t)
    return table


def held_as(held: Mapping[str, Any], name: str) -> Any:
    """What `held` (the engine's names) holds under the trainer's `name`, a wrapper's prefix
    (`WRAPPER_PREFIXES`) dropped if need be; None when it holds nothing by that name."""
    got = held.get(name)
    for prefix in WRAPPER_PREFIXES:
        if got is None:
            got = held.get(name.removeprefix(prefix))
    return got


def held_exactly(engine_tensors: Mapping[str, torch.Tensor],
                 trainer_named: Iterable[tuple[str, torch.Tensor]]) -> tuple[bool, str | None]:
    """(True, None) when every trainer tensor is held by the engine byte for byte, else
    (False, the first tensor's name that is missing or differs)."""
    for name, t in trainer_named:
        held = held_as(engine_tensors, name)
        if held is None:
            return False, name
        held, t = held.detach(), t.detach()
        if same_tensor(held, t):
            continue
        if not same_bytes(held, t.to(held.device, held.dtype)):
            return False, name
    return True, None


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bytes (not `==`: NaN's bytes equal themselves, -0.0's are not 0.0's)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def held_report(module: torch.nn.Module, with_digests: bool = True) -> dict[str, dict[str, str]]:
    """What a receiver holds, for a sender across a wire: {"dtypes": {name: dtype}, "digests":
    {name: digest}} of the module's tensors (`module_tensors`); without digests nothing is hashed."""
    table = module_tensors(module)
    report = {"dtypes": {name: dtype_name(t.dtype) for name, t in table.items()}}
    if with_digests:
        report["digests"] = digests(table.items())
    return report


def digests_held(held: Mapping[str, str], sent: Mapping[str, str]) -> tuple[bool, str | None]:
    """`held_exactly` over a wire: (True, None) when the receiver's digests `held` match the
    digests `sent` for every tensor sent, else (False, the first tensor's name missing or differing)."""
    for name, want in sent.items():
        if held_as(held, name) != want:
            return False, name
    return True, None
