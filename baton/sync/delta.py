"""Delta sync (issue 49 part 5): send only the tensors whose digest changed since the version
every receiver holds.

    held = Held()                                     # one per transport (its receivers)
    names = held.to_send(sent, sizes, [version of each receiver])   # None: all of them
    ... push those (with held.id as the base), each receiver checks them and installs ...
    held.installed(version, sent)

The sender remembers the version it last installed everywhere and the digest of each tensor
it sent then. Before a push it asks each receiver which version it serves: all at that
version, the push carries only the tensors whose digest differs (a receiver's other tensors
are, byte for byte, what it was sent then: it checked them); any receiver at another version
(restarted, loaded by someone else, a push refused or never acknowledged), a first push, or
tensors added or renamed: the whole model. At least one tensor always goes (the smallest, when
none changed), so every receiver installs a version the same way. A version number is not an identity (a restarted server may load other weights
under the number this trainer last pushed), so every push also names its weights: `weights_id`,
a digest of all the tensors' digests, which the receiver keeps (`installed_as`; any other
install clears it), and a delta carries the id it was built on (`base_weights`): the receiver
refuses it unless it holds exactly those (`check_base`), and the sender then pushes the whole
model once. A delta is never applied on top of other weights.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Callable, Sequence

import torch

from baton.sync.digest import digests


class StaleBase(ValueError):
    """A delta built on a version the receiver does not serve (it needs a full push)."""


def stale_refusal(exc: BaseException) -> bool:
    """A receiver refused a delta for its base (in process: `StaleBase`; a server: a 409 saying so)."""
    return isinstance(exc, StaleBase) or ("-> 409" in str(exc) and "a delta on weights" in str(exc))


def weights_id(digests: dict[str, str]) -> str:
    """The identity of a whole set of weights: sha256 (16 hex) of every name and digest."""
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}={digests[name]}\n".encode())
    return h.hexdigest()[:16]


def check_base(engine: Any, base_weights: str | None) -> None:
    """Receiver side: refuse a delta unless `engine` holds the weights it was built on."""
    held = engine.weights_id
    if base_weights is not None and held != base_weights:
        raise StaleBase(f"a delta on weights {base_weights} cannot be applied: this engine holds "
                        f"{held or 'weights no digest-carrying push installed'} (version "
                        f"{engine.version}); the trainer sends the whole model next")


def installed_as(engine: Any, weights: str | None) -> None:
    """After any install of base weights: the identity the push named (None: not known)."""
    engine.weights_id = weights


def receiver_version(receiver: Any) -> int | None:
    """The version a receiver serves now: a server is asked (`served_version`), an engine in
    this process (or a `WeightReceiver`'s) is read."""
    return receiver.served_version()


def takes_delta(receiver: Any) -> bool:
    """Whether a receiver installs a subset of the tensors: baton's engines and servers do; a
    vLLM engine (`partial_weight_updates = False`) or server, or SGLang, takes a full set."""
    return receiver.partial_weight_updates


class Held:
    """What every receiver of one transport holds: the version last installed and its digests."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.version: int | None = None
        self.digests: dict[str, str] = {}
        self.id: str | None = None  # weights_id(digests): what a delta is built on

    def to_send(self, sent: dict[str, str], sizes: dict[str, int], versions: Sequence[int | None]) -> list[str] | None:
        """The names to send for a push of tensors with digests `sent` (`sizes`: their bytes)
        to receivers serving `versions`; None: every tensor (a full sync)."""
        if (not self.enabled or self.version is None or set(sent) != set(self.digests)
                or any(v != self.version for v in versions)):
            return None
        changed = [n for n, d in sent.items() if self.digests[n] != d]
        return changed or [min(sent, key=lambda n: sizes[n])]

    def push(self, engines: Sequence[Any], named: list[tuple[str, torch.Tensor]], version: int,
             send: Callable[[list[tuple[str, torch.Tensor]], dict[str, str], int, str | None], None]
             ) -> dict[str, float]:
        """One push of `named` as `version` to `engines` through the transport's
        `send(tensors, digests of all, version, base)`: only the tensors changed since what every
        engine holds (a delta on `self.id`, the base) when all take deltas, else all (base
        None); a delta refused as stale is sent whole, once. Returns what moved (sync/bytes,
        sync/seconds, sync/tensors: the transport's `last`)."""
        t0 = time.perf_counter()
        every = digests(named)  # each engine checks what arrived against these before installing
        sizes = {n: nbytes(t) for n, t in named}
        keep = None
        if self.enabled and all(takes_delta(e) for e in engines):
            keep = self.to_send(every, sizes, [receiver_version(e) for e in engines])
        keep = None if keep is None else set(keep)
        try:
            send([(n, t) for n, t in named if keep is None or n in keep], every, version,
                 None if keep is None else self.id)
        except BaseException as exc:
            self.forget()  # the engines' state is not known: the next push is whole
            if keep is None or not stale_refusal(exc):
                raise
            keep = None
            send(named, every, version, None)  # an engine moved since we asked: whole, once
        self.installed(version, every)
        moved = sizes if keep is None else keep
        return {"sync/bytes": float(sum(sizes[n] for n in moved)), "sync/seconds": time.perf_counter() - t0,
                "sync/tensors": float(len(moved))}

    def installed(self, version: int, sent: dict[str, str]) -> None:
        self.version, self.digests, self.id = version, dict(sent), weights_id(sent)

    def forget(self) -> None:
        """A push failed or was refused: the receivers' state is not known; the next is full."""
        self.version, self.digests, self.id = None, {}, None


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
