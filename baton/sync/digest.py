"""Weight digests: what a sync sent, per tensor, so the receiver can check what it is about to
serve is exactly that, before it serves it (issue 49).

    sent = digests(named_params)                 # the sender: {name: "sha256 hex (16)"}
    check_digests(named_tensors_read, sent)      # the receiver: WeightDigestError naming the tensor
    engine.update_weights(staged(arriving, sent), version)   # a stream: all checked, then installed

A digest covers a tensor's dtype, shape and bytes. `check_digests` refuses (one line naming
the first tensor) a tensor whose bytes differ (a flipped byte in transit or on disk), a
tensor sent and not received (a cut body) and one received and not sent. The receiver keeps
its old weights and version: it checks before it installs. A receiver fed a stream (the
broadcast's buckets) holds what arrives until the last tensor is checked (`staged`): one
model's worth of receive buffers, the price of never installing half a version.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch


DIGEST_BYTES = 8  # a digest's 16 hex digits, as bytes (`baton.sync.group.send_digests`)


class WeightDigestError(ValueError):
    """What a receiver read is not what the sender sent (names the tensor)."""


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 (first 16 hex digits) of a tensor's dtype, shape and bytes."""
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:2 * DIGEST_BYTES]


def digests(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    return {name: tensor_digest(t) for name, t in named}


def check_digests(named: Iterable[tuple[str, torch.Tensor]], sent: dict[str, str]) -> int:
    """Check each received tensor against `sent`; returns how many matched, else raises
    WeightDigestError naming the first tensor that differs, was not sent, or did not arrive."""
    seen: set[str] = set()
    for name, t in named:
        want = sent.get(name)
        if want is None:
            raise WeightDigestError(f"tensor {name!r} was received but not sent (no digest for it)")
        got = tensor_digest(t)
        if got != want:
            raise WeightDigestError(f"tensor {name!r}: digest {got} of what arrived != {want} sent (corrupted in transit)")
        seen.add(name)
    missing = [n for n in sent if n not in seen]
    if missing:
        raise WeightDigestError(f"tensor {missing[0]!r} was sent and did not arrive ({len(missing)} of {len(sent)} "
                                f"missing: a cut transfer)")
    return len(seen)


def staged(named: Iterable[tuple[str, torch.Tensor]], sent: dict[str, str]) -> list[tuple[str, torch.Tensor]]:
    """Every (name, tensor) of `named`, checked against `sent` (`check_digests`) before any is
    returned: a stream is installed whole or not at all. The tensors are kept as they arrive
    (a broadcast's receive buffers are fresh per bucket), not copied."""
    kept: list[tuple[str, torch.Tensor]] = []

    def keep() -> Iterable[tuple[str, torch.Tensor]]:
        for name, t in named:
            kept.append((name, t))
            yield name, t
    check_digests(keep(), sent)
    return kept
