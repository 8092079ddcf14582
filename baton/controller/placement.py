"""The `placement:` section of a recipe: backend, pools of slots, and which role runs where.

Roles default to the pool "main" (`world_size` slots); `pools` adds named pools and `roles`
maps a role to one of them. Roles on one pool are colocated (one process per slot hosts
them all); roles on different pools run concurrently. `check` validates the map against
the roles a trainer runs, before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class PlacementConfig:
    backend: Literal["local", "ray"] = "local"
    world_size: int = 1  # size of the "main" pool: data-parallel actor ranks
    # Extra pools (name -> workers) and a role -> pool map. E.g. pools={aux: 1},
    # roles={reward: aux, reference: aux} puts scoring on its own worker.
    pools: dict[str, int] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    cpus_per_worker: int = 1
    gpus_per_worker: int = 0
    threads_per_worker: int = 0  # torch threads in each worker process; 0 = torch's default

    def pool_sizes(self) -> dict[str, int]:
        return {"main": self.world_size, **self.pools}

    def pool_of(self, role: str) -> str:
        return self.roles.get(role, "main")

    def check(self, known_roles: list[str], same_pool: tuple[str, ...] = ()) -> None:
        """Raise ValueError for a map that cannot be built; `same_pool` roles must share one."""
        if self.world_size < 1 or any(n < 1 for n in self.pools.values()):
            raise ValueError(f"placement: pool sizes must be >= 1 (world_size={self.world_size}, pools={self.pools})")
        if self.threads_per_worker < 0 or self.cpus_per_worker < 0 or self.gpus_per_worker < 0:
            raise ValueError("placement: threads_per_worker, cpus_per_worker and gpus_per_worker must be >= 0")
        if self.backend == "local" and any(n != 1 for n in self.pool_sizes().values()):
            raise ValueError(f"placement.backend=local runs one worker in the driver's process: use "
                             f"placement.backend=ray for pools larger than 1 (sizes {self.pool_sizes()})")
        unknown = sorted(set(self.roles) - set(known_roles))
        if unknown:
            raise ValueError(f"placement.roles: unknown role(s) {unknown}; this trainer's roles are {known_roles}")
        bad = sorted({p for p in self.roles.values() if p not in self.pool_sizes()})
        if bad:
            raise ValueError(f"placement.roles refers to undefined pool(s) {bad}; define them in placement.pools "
                             f"(pools: {sorted(self.pool_sizes())})")
        if len({self.pool_of(r) for r in same_pool}) > 1:
            raise ValueError(f"placement.roles: {' and '.join(same_pool)} must share a pool (the engine reads the "
                             f"actor's weights in place)")
