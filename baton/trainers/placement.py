"""Place the roles of a PPO-family run on resource pools.

Today every role is colocated on one pool of `placement.world_size` slots: each slot is one
process hosting the actor, the rollout engine (which reads the actor's weights in place),
the reward functions and, when KL is on, the reference. On the `local` backend that
process is the driver itself (world size 1; breakpoints in workers work).
"""

from __future__ import annotations

from typing import Any

from baton.controller import ResourcePool, colocated_groups
from baton.trainers.grpo_config import GRPOConfig


def build_roles(cfg: GRPOConfig) -> dict[str, Any]:
    from baton.workers.actor import ActorWorker
    from baton.workers.reference import ReferenceWorker
    from baton.workers.reward import RewardWorker
    from baton.workers.rollout import RolloutWorker

    p = cfg.placement
    if p.backend == "local" and p.world_size != 1:
        raise ValueError(f"placement.world_size={p.world_size} needs placement.backend=ray; "
                         "the local backend runs one worker in the driver's process")
    pool = ResourcePool(p.world_size, backend=p.backend, cpus_per_worker=p.cpus_per_worker,
                        gpus_per_worker=p.gpus_per_worker, name="main")
    roles = {"actor": (ActorWorker, (cfg,), {}),  # first: the rollout engine borrows its module
             "rollout": (RolloutWorker, (cfg,), {}),
             "reward": (RewardWorker, (cfg,), {})}
    if cfg.algo.kl_coef > 0:
        roles["reference"] = (ReferenceWorker, (cfg,), {})
    return colocated_groups(pool, roles)
