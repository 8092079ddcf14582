"""What the embedded engine holds, and when: the weights the trainer pushes in
(`update_weights`, `holds_weights`, `served_version`) and the memory `sleep` frees and
`wake` brings back, per `sleep_mode` (SLEEP_MODES: the KV cache; also the weights, moved to
the CPU or discarded and refilled by the next `update_weights`).

`Residency` is a part of `EmbeddedEngine` (baton/rollout/embedded/engine.py), which sets
the attributes it reads (`model`, `runner`, `graphs`, `version`, `sleep_mode`, the
sleep state) in its constructor; it has no constructor of its own.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from baton.rollout.embedded.llama import LlamaRunner, fuse_storage
from baton.sync.verify import WRAPPER_PREFIXES, module_tensors

SLEEP_MODES = ("cache", "offload", "discard")


class Residency:
    """The weights and memory half of `EmbeddedEngine` (see the module docstring)."""

    model: nn.Module  # what it reads, as EmbeddedEngine.__init__ sets it
    runner: Any  # LlamaRunner | HFRunner
    graphs: Any  # static decode's DecodeGraphs
    version: int
    sleep_mode: str
    device: torch.device
    _asleep: bool
    _device: torch.device | None  # the weights' device while offloaded
    _discarded: list[tuple[torch.Tensor, torch.Size]]  # (param, shape) while discarded
    _missing: dict[int, str]  # id(param) -> name: still to refill after a discard
    _in_flight: Any  # the generations started and not ended

    # --- weights -----------------------------------------------------------------------
    @property
    def holds_weights(self) -> bool:
        """Every parameter holds what was last installed (none discarded by `sleep` and not
        yet refilled): a delta sync may build on it (`baton.sync.delta`)."""
        return not self._missing and not (self._asleep and self.sleep_mode == "discard")

    def served_version(self) -> int | None:
        """Its version; None while its weights are discarded (a delta has nothing to build on)."""
        return self.version if self.holds_weights else None

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy (name, tensor) pairs into the model's parameters in place."""
        table = module_tensors(self.model)
        with torch.no_grad():
            for name, tensor in weights:
                target = table.get(name)
                if target is None:
                    stripped = name
                    for prefix in WRAPPER_PREFIXES:
                        stripped = stripped.removeprefix(prefix)
                    target = table.get(stripped)
                    name = stripped
                if target is None:
                    raise KeyError(f"update_weights: unknown parameter {name!r}")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"update_weights: {name!r} has shape {tuple(target.shape)}, "
                                     f"got {tuple(tensor.shape)}")
                target.copy_(tensor)
                self._missing.pop(id(target), None)
        # generations started from now on fuse the new weights (into a new copy while those
        # in flight still read the old one; else into the old one, in place: same addresses)
        self.runner.forget() if self._in_flight else self.runner.unpack()
        self.version = version

    # --- memory ------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the KV cache (always) and, per `sleep_mode`, the weights' memory."""
        if self._asleep:
            return
        self.runner.release()
        self.runner.forget()
        self.graphs.clear()  # the arenas' KV memory (and their graphs) go too
        if self.sleep_mode == "offload":
            self._device = self.device
            self.model.to("cpu")
        elif self.sleep_mode == "discard":
            self._device = self.device
            self._discarded = [(p, p.shape) for p in self.model.parameters()]  # tied: once
            for p, _ in self._discarded:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self._asleep = True

    def wake(self) -> None:
        if not self._asleep:
            return
        if self.sleep_mode == "offload":
            self.model.to(self._device)
        elif self.sleep_mode == "discard":
            for p, shape in self._discarded:
                p.data = torch.empty(shape, dtype=p.dtype, device=self._device)
            self._missing = {id(p): name for name, p in self.model.named_parameters()}
            self._discarded = []
            self._lay_out()
        self._asleep = False

    def _lay_out(self) -> None:
        """An own module on the fast path (sleep_mode "discard"): Q|K|V and gate|up back to back."""
        if self.sleep_mode == "discard" and isinstance(self.runner, LlamaRunner):
            fuse_storage(self.model)
