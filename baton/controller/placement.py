"""The `placement:` section of a recipe: backend, pools of slots, and which role runs where.

`auto: true` lets `baton.trainers.placement.auto.choose` pick devices, ranks and threads the recipe leaves
unset (applied when the recipe is loaded: `baton.trainers.algorithms.load_recipe`, which
`baton train` uses); never what is computed (trainer.mode is the recipe's).
Roles default to the pool "main" (`world_size` slots); `pools` adds named pools and `roles`
maps a role to one of them. Roles on one pool are colocated (one process per slot hosts
them all); roles on different pools run concurrently. `check` validates the map against
the roles a trainer runs, before anything starts.

`mesh` shapes the main pool's ranks as a (dp, fsdp, tp) device mesh, e.g. {fsdp: 2, tp: 2}
on 8 ranks gives dp = 8 / (2 * 2) = 2; data is split over dp x fsdp, tp peers share rows.
How a role's module uses the mesh is its `strategy` (`baton.models.parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class PlacementConfig:
    # auto: true (baton.trainers.placement.auto.choose) fills backend, world_size,
    # threads_per_worker and gpus_per_worker from the machine where the recipe leaves them
    # unset, when the recipe is loaded (baton.trainers.algorithms.load_recipe); never trainer.mode.
    # A config built in Python (load_config) is placed as given.
    auto: bool = False  # choose devices, ranks and threads from the machine for what the recipe leaves unset
    backend: Literal["local", "ray"] = "local"
    world_size: int = 1  # size of the "main" pool: data-parallel actor ranks
    # Extra pools (name -> workers) and a role -> pool map. E.g. pools={aux: 1},
    # roles={reward: aux, reference: aux} puts scoring on its own worker.
    pools: dict[str, int] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    cpus_per_worker: int = 1
    gpus_per_worker: int = 0
    threads_per_worker: int = 0  # torch threads in each worker process; 0 = torch's default
    # the main pool's (dp, fsdp, tp) sizes; missing dims are 1, dp takes what is left
    mesh: dict[str, int] = field(default_factory=dict)
    # Many machines (Ray backend): how each pool's ranks are laid over nodes -- PACK (few nodes),
    # SPREAD, STRICT_PACK (one node), STRICT_SPREAD (one rank per node) -- by default and per
    # pool, and extra Ray resources per rank by pool, e.g. resources={gen: {gen_node: 1}} puts
    # the pool "gen" (the generator) on the nodes started with that custom resource.
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    strategies: dict[str, str] = field(default_factory=dict)
    resources: dict[str, dict[str, float]] = field(default_factory=dict)

    def pool_sizes(self) -> dict[str, int]:
        return {"main": self.world_size, **self.pools}

    def pool_specs(self) -> dict[str, int | dict]:
        """`build_role_groups`' pools: sizes, and the main pool's mesh when one is set."""
        specs: dict[str, int | dict] = {**self.pool_sizes()}
        if self.mesh:
            specs["main"] = {"world_size": self.world_size, "mesh": dict(self.mesh)}
        for name in specs:
            extra = {**({"strategy": self.strategies.get(name, self.strategy)}
                        if self.strategies.get(name, self.strategy) != "PACK" else {}),
                     **({"resources": dict(self.resources[name])} if self.resources.get(name) else {})}
            if extra:
                spec = specs[name]
                specs[name] = {**(spec if isinstance(spec, dict) else {"world_size": spec}), **extra}
        return specs

    def pool_of(self, role: str) -> str:
        return self.roles.get(role, "main")

    def check(self, known_roles: list[str], same_pool: tuple[str, ...] = ()) -> None:
        """Raise ValueError for a map that cannot be built; `same_pool` roles must share one."""
        if self.auto:
            raise ValueError("placement.auto=true is applied when the recipe is loaded (`baton train`, or "
                             "baton.trainers.algorithms.load_recipe in Python); this config was built without it")
        if self.world_size < 1 or any(n < 1 for n in self.pools.values()):
            raise ValueError(f"placement: pool sizes must be >= 1 (world_size={self.world_size}, pools={self.pools})")
        if self.threads_per_worker < 0 or self.cpus_per_worker < 0 or self.gpus_per_worker < 0:
            raise ValueError("placement: threads_per_worker, cpus_per_worker and gpus_per_worker must be >= 0")
        if self.backend == "local" and self.cpus_per_worker != 1:
            raise ValueError(f"placement.cpus_per_worker={self.cpus_per_worker} is read only with placement.backend=ray "
                             f"(Ray's CPUs reserved per worker): remove it, or set placement.threads_per_worker "
                             f"for the torch threads of a local run")
        if self.backend == "local" and any(n != 1 for n in self.pool_sizes().values()):
            raise ValueError(f"placement.backend=local runs one worker in the driver's process: use "
                             f"placement.backend=ray for pools larger than 1 (sizes {self.pool_sizes()})")
        if self.mesh:
            from baton.controller.dispatch import normalize_mesh
            try:
                normalize_mesh(self.mesh, self.world_size)
            except (ValueError, ZeroDivisionError) as e:
                raise ValueError(f"placement.mesh={self.mesh} does not fit placement.world_size="
                                 f"{self.world_size}: {e}") from None
        from baton.controller.pool import PG_STRATEGIES
        bad_s = {k: v for k, v in self.strategies.items() if v not in PG_STRATEGIES}
        if bad_s:
            raise ValueError(f"placement.strategies: {bad_s}; each must be one of {PG_STRATEGIES}")
        stray = sorted((set(self.strategies) | set(self.resources)) - set(self.pool_sizes()))
        if stray:
            raise ValueError(f"placement.strategies/resources name undefined pool(s) {stray} "
                             f"(pools: {sorted(self.pool_sizes())})")
        if self.backend == "local" and (self.strategy != "PACK" or self.strategies or self.resources):
            raise ValueError("placement.strategy/strategies/resources lay Ray ranks over nodes: "
                             "they need placement.backend=ray")
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
