"""Place the roles of a PPO-family run on resource pools.

By default every role is colocated on the pool "main" of `placement.world_size` slots: each
slot is one process hosting the actor, the rollout engine (which reads the actor's weights
in place), the reward functions and, when KL is on, the reference. `placement.pools` and
`placement.roles` move the reward and/or reference roles to pools of their own (split
placement), where their calls run concurrently. On the `local` backend every pool is the
driver's own process (world size 1; breakpoints in workers work).
"""

from __future__ import annotations

from typing import Any

from baton.controller import build_role_groups
from baton.trainers.grpo_config import GRPOConfig


def build_roles(cfg: GRPOConfig) -> dict[str, Any]:
    from baton.workers.actor import ActorWorker
    from baton.workers.reference import ReferenceWorker
    from baton.workers.reward import RewardWorker
    from baton.workers.rollout import RolloutWorker

    p = cfg.placement
    if p.backend == "local" and (p.world_size != 1 or any(n != 1 for n in p.pools.values())):
        raise ValueError("the local backend runs one worker in the driver's process: use "
                         "placement.backend=ray for placement.world_size or pools larger than 1")
    classes = {"actor": (ActorWorker, (cfg,), {}),  # first: the rollout engine borrows its module
               "rollout": (RolloutWorker, (cfg,), {}),
               "reward": (RewardWorker, (cfg,), {})}
    if cfg.algo.kl_coef > 0:
        classes["reference"] = (ReferenceWorker, (cfg,), {})
    roles = {role: p.roles.get(role, "main") for role in classes}
    pools = {"main": p.world_size, **p.pools}
    return build_role_groups(pools, roles, classes, backend=p.backend,
                             cpus_per_worker=p.cpus_per_worker, gpus_per_worker=p.gpus_per_worker)
