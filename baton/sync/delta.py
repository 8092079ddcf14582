"""Delta sync (issue 49 part 5): send only the tensors whose digest changed since the version
every receiver holds.

    held = Held()                                     # one per transport (its receivers)
    names = held.to_send(sent, [version of each receiver])   # None: all of them
    ... push those, each receiver checks them (digests) and installs ...
    held.installed(version, sent)

The sender remembers the version it last installed everywhere and the digest of each tensor
it sent then. Before a push it asks each receiver which version it serves: all at that
version, the push carries only the tensors whose digest differs (a receiver's other tensors
are, byte for byte, what it was sent then: it checked them); any receiver at another version
(restarted, loaded by someone else, a push refused or never acknowledged), a first push, or
tensors added or renamed: the whole model. At least one tensor always goes (the smallest
changed, or the smallest of all when none changed), so every receiver installs a version the
same way. The receiver checks the base version too (`check_base`): a delta built for another
version is refused, never applied on top of the wrong weights.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


class StaleBase(ValueError):
    """A delta built on a version the receiver does not serve (it needs a full push)."""


def stale_refusal(exc: BaseException) -> bool:
    """A receiver refused a delta for its base (in process: `StaleBase`; a server: a 409 saying so)."""
    return isinstance(exc, StaleBase) or ("-> 409" in str(exc) and "a delta on version" in str(exc))


def check_base(engine: Any, base_version: int | None) -> None:
    """Receiver side: refuse a delta whose base is not the version `engine` serves."""
    if base_version is not None and getattr(engine, "version", None) != base_version:
        raise StaleBase(f"a delta on version {base_version} cannot be applied: this engine serves version "
                        f"{getattr(engine, 'version', None)} (the trainer sends the whole model next)")


def receiver_version(receiver: Any) -> int | None:
    """The version a receiver serves now: a server is asked (`served_version`), an engine in
    this process (or a `WeightReceiver`'s) is read."""
    if hasattr(receiver, "served_version"):
        return receiver.served_version()
    engine = getattr(receiver, "engine", receiver)
    if not getattr(engine, "holds_weights", True):  # its weights discarded while asleep: nothing to build on
        return None
    return getattr(engine, "version", None)


def takes_delta(receiver: Any) -> bool:
    """Whether a receiver installs a subset of the tensors: baton's engines and servers do; a
    vLLM engine (`partial_weight_updates = False`) or server, or SGLang, takes a full set."""
    if getattr(receiver, "dialect", "baton") != "baton":
        return False
    return getattr(getattr(receiver, "engine", receiver), "partial_weight_updates", True)


class Held:
    """What every receiver of one transport holds: the version last installed and its digests."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.version: int | None = None
        self.digests: dict[str, str] = {}

    def to_send(self, sent: dict[str, str], sizes: dict[str, int], versions: Sequence[int | None]) -> list[str] | None:
        """The names to send for a push of tensors with digests `sent` (`sizes`: their bytes)
        to receivers serving `versions`; None: every tensor (a full sync)."""
        if (not self.enabled or self.version is None or set(sent) != set(self.digests)
                or any(v != self.version for v in versions)):
            return None
        changed = [n for n, d in sent.items() if self.digests[n] != d]
        return changed or [min(sent, key=lambda n: sizes[n])]

    def installed(self, version: int, sent: dict[str, str]) -> None:
        self.version, self.digests = version, dict(sent)

    def forget(self) -> None:
        """A push failed or was refused: the receivers' state is not known; the next is full."""
        self.version, self.digests = None, {}


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
