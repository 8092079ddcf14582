"""`ResourcePool`: a set of device slots, one process each, and the local backend.

A pool *is* its processes: every WorkerGroup built on the same pool adds its role to the
same per-slot processes (colocation). Roles meant to run side by side go on different
pools. The processes start with the first group and stop when the last group leaves
(or at `pool.shutdown()`).

Backends share one small interface: `start()`, `create_role(role, cls, args, kwargs)`,
`remove_role(role)`, `call(role, cls_name, method, spec, args, kwargs) -> Future`, `shutdown()`.
"""

from __future__ import annotations

import itertools
import uuid
import weakref
from typing import Any

from baton.controller.dispatch import Execute, MethodSpec, Topology, normalize_mesh
from baton.controller.future import Future, LocalFuture, split_call
from baton.controller.worker import HostCore, WorkerError

_POOLS: "weakref.WeakValueDictionary[str, ResourcePool]" = weakref.WeakValueDictionary()
_NAMES = itertools.count()


class ResourcePool:
    def __init__(self, world_size: int, backend: str = "local", cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0, mesh: Any = None, name: str | None = None,
                 dist_timeout_s: float = 60.0, ready_timeout_s: float = 120.0) -> None:
        if backend not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if backend == "local" and world_size != 1:
            raise ValueError("the local backend runs one rank in the driver process (world_size=1); "
                             f"got world_size={world_size}: use backend='ray'")
        self.world_size, self.backend_name = int(world_size), backend
        self.cpus_per_worker, self.gpus_per_worker = cpus_per_worker, gpus_per_worker
        self.topology = Topology(self.world_size, normalize_mesh(mesh, self.world_size))
        self.name = name or f"pool{next(_NAMES)}"
        self.dist_timeout_s, self.ready_timeout_s = dist_timeout_s, ready_timeout_s
        self.uid = f"{self.name}-{uuid.uuid4().hex[:8]}"
        self.roles: list[str] = []
        self.broken: str | None = None  # why the pool's processes cannot be trusted any more
        self.generation = 0  # bumped by shutdown(): groups of an earlier generation are gone
        self._backend: Any = None
        _POOLS[self.uid] = self

    @property
    def mesh(self) -> tuple[int, int, int]:
        return self.topology.mesh

    @property
    def backend(self) -> Any:
        if self._backend is None:
            if self.backend_name == "ray":
                from baton.controller.ray_backend import RayBackend
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


def mark_origin_broken(err: WorkerError) -> None:
    pool = _POOLS.get(err.origin) if err.origin else None
    if pool is not None and pool.backend_name == "ray":
        pool.mark_broken(str(err))


class LocalBackend:
    """World size 1 in the driver's own process: a breakpoint in a worker method works.
    No peer can be left stuck in a collective, so a failed call does not break the pool."""

    def __init__(self, pool: ResourcePool) -> None:
        self.pool = pool
        self.host = HostCore(pool.uid, pool.topology, rank=0, chain_errors=True)
        self.pids: list[int] = []

    def start(self) -> None:
        if self.pool.gpus_per_worker:
            import torch
            use_cuda = torch.cuda.is_available()
        else:
            use_cuda = False
        self.pids = [self.host.setup(0, use_cuda, self.pool.dist_timeout_s, None)]

    def create_role(self, role: str, cls: type, args: tuple, kwargs: dict) -> list[int]:
        return [self.host.create(role, cls, args, kwargs)]

    def remove_role(self, role: str) -> None:
        self.host.remove(role)

    def call(self, role: str, cls_name: str, method: str, spec: MethodSpec, args: tuple,
             kwargs: dict) -> Future:
        topo, mode = self.pool.topology, spec.mode
        try:
            (r_args, r_kwargs), = split_call(mode, topo, args, kwargs,
                                             lambda f: mode.split(f.get(), topo))
            out = self.host.call(role, method, spec.dispatch, r_args, r_kwargs)
            value = out if spec.execute == Execute.RANK_ZERO else mode.collect([out], topo)
        except WorkerError as e:
            return LocalFuture(error=e)
        return LocalFuture(value)

    def shutdown(self) -> None:
        # The driver's process group stays: other local pools in this process share it.
        self.host.roles.clear()
