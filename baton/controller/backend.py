"""The interface a backend gives a `ResourcePool`: start the slots' processes, host roles
in them, and run calls. Two implementations: `local_backend.LocalBackend` (the driver's own
process) and `ray_backend.RayBackend` (one Ray actor per slot).

A backend is built with its pool (`Backend(pool)`) and reads the pool's size, topology and
per-slot settings from it; it marks the pool broken when a rank fails in a way that can
leave its peers stuck (see `ResourcePool.mark_broken`).
"""

from __future__ import annotations

from typing import Any, Protocol

from baton.controller.dispatch import MethodSpec
from baton.controller.future import Future


class Backend(Protocol):
    pids: list[int]  # one process id per slot, after start()

    def start(self) -> None:
        """Start one process per slot and set up its process group and torch threads."""
        ...

    def create_role(self, role: str, cls: type, args: tuple, kwargs: dict) -> list[int]:
        """Instantiate `cls(*args, **kwargs)` as `role` in every slot; returns the pids."""
        ...

    def remove_role(self, role: str) -> None: ...

    def call(self, role: str, cls_name: str, method: str, spec: MethodSpec, args: tuple,
             kwargs: dict) -> Future:
        """Split the arguments by `spec`'s dispatch mode, run on the ranks, collect."""
        ...

    def call_log(self, role: str) -> list[dict[str, Any]]:
        """Start/end wall-clock times of `role`'s calls on every rank since the last
        call_log: dicts with role, method, rank, pid, start, end (time.time() seconds)."""
        ...

    def shutdown(self) -> None: ...
