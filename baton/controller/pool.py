"""`ResourcePool`: a set of device slots, one process each.

A pool *is* its processes: every WorkerGroup built on the same pool adds its role to the
same per-slot processes (colocation). Roles meant to run side by side go on different
pools. The processes start with the first group and stop when the last group leaves
(or at `pool.shutdown()`).

Backends share one small interface (`baton.controller.backend.Backend`): `local` runs the
slot in the driver's process, `ray` one Ray actor per slot. `threads_per_worker` sets torch's
intra-op threads once per slot process, for every role it hosts.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from baton.controller.backend import Backend
from baton.controller.dispatch import Topology, normalize_mesh
from baton.controller.local_backend import LocalBackend

_NAMES = itertools.count()


PG_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

class ResourcePool:
    def __init__(self, world_size: int, backend: str = "local", cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0, mesh: Any = None, name: str | None = None,
                 dist_timeout_s: float = 60.0, ready_timeout_s: float = 120.0,
                 threads_per_worker: int = 0, strategy: str = "PACK",
                 resources: dict[str, float] | None = None) -> None:
        if backend not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if backend == "local" and world_size != 1:
            raise ValueError("the local backend runs one rank in the driver process (world_size=1); "
                             f"got world_size={world_size}: use backend='ray'")
        self.world_size, self.backend_name = int(world_size), backend
        self.cpus_per_worker, self.gpus_per_worker = cpus_per_worker, gpus_per_worker
        if threads_per_worker < 0:
            raise ValueError(f"threads_per_worker must be >= 0 (0 = torch's default), got {threads_per_worker}")
        self.threads_per_worker = int(threads_per_worker)
        if strategy not in PG_STRATEGIES:
            raise ValueError(f"strategy must be one of {PG_STRATEGIES}, got {strategy!r}")
        # Ray placement-group strategy of the pool's bundles (PACK: as few nodes as fit; SPREAD:
        # over nodes when it can; STRICT_SPREAD: one rank per node) and extra Ray resources each
        # bundle asks for (custom node resources pin a pool to nodes that offer them).
        self.strategy, self.resources = strategy, dict(resources or {})
        self.topology = Topology(self.world_size, normalize_mesh(mesh, self.world_size))
        self.name = name or f"pool{next(_NAMES)}"
        self.dist_timeout_s, self.ready_timeout_s = dist_timeout_s, ready_timeout_s
        self.uid = f"{self.name}-{uuid.uuid4().hex[:8]}"
        self.roles: list[str] = []
        self.broken: str | None = None  # why the pool's processes cannot be trusted any more
        self.generation = 0  # bumped by shutdown(): groups of an earlier generation are gone
        self._backend: Backend | None = None

    @property
    def mesh(self) -> tuple[int, int, int]:
        return self.topology.mesh

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            if self.backend_name == "ray":
                from baton.controller.ray_backend import RayBackend  # imports ray: only when used
                self._backend = RayBackend(self)
            else:
                self._backend = LocalBackend(self)
            self._backend.start()
        return self._backend

    def mark_broken(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason

    def shutdown(self) -> None:
        """Stop the pool's processes (Ray: kill the actors, free the placement group)."""
        if self._backend is not None:
            self._backend.shutdown()
            self._backend = None
        self.roles.clear()
        self.broken = None  # the next group starts fresh processes
        self.generation += 1

    def __repr__(self) -> str:
        return (f"ResourcePool({self.name!r}, world_size={self.world_size}, backend={self.backend_name!r}, "
                f"mesh={self.mesh}, roles={self.roles})")
