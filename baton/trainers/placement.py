"""Place the roles of a PPO-family run on resource pools, each role given only its own
config sections.

By default every role is colocated on the pool "main" of `placement.world_size` slots: each
slot is one process hosting the actor, the rollout engine (which reads the actor's `Policy`
in place), the reward functions and, when KL is on, the reference. `placement.pools` and
`placement.roles` move the reward and/or reference roles to pools of their own (split
placement), where their calls run concurrently. On the `local` backend every pool is the
driver's own process (world size 1; breakpoints in workers work).
"""

from __future__ import annotations

from typing import Any

from baton.controller import build_role_groups
from baton.trainers.grpo_config import GRPOConfig
from baton.workers.actor import ActorWorker
from baton.workers.reference import ReferenceWorker
from baton.workers.reward import RewardWorker
from baton.workers.rollout import RolloutWorker


def build_roles(cfg: GRPOConfig, probe_prompt: str) -> dict[str, Any]:
    """{role: WorkerGroup}. `probe_prompt`: the prompt of the weight-sync parity check."""
    r = cfg.rollout
    classes = {  # the actor first: the colocated rollout engine takes its Policy handle
        "actor": (ActorWorker, (cfg.model, cfg.actor, cfg.algo),
                  dict(temperature=r.temperature, max_new_tokens=r.max_new_tokens,
                       total_steps=cfg.trainer.steps, seed=cfg.trainer.seed)),
        "rollout": (RolloutWorker, (r,), dict(task=cfg.data.task, seed=cfg.trainer.seed,
                                              probe_prompt=probe_prompt)),
        "reward": (RewardWorker, (cfg.reward,), {}),
    }
    if cfg.algo.kl_coef > 0:
        classes["reference"] = (ReferenceWorker, (cfg.model,),
                                dict(temperature=r.temperature, micro_batch_size=cfg.actor.micro_batch_size))
    p = cfg.placement
    return build_role_groups(p.pool_sizes(), {role: p.pool_of(role) for role in classes}, classes,
                             backend=p.backend, cpus_per_worker=p.cpus_per_worker,
                             gpus_per_worker=p.gpus_per_worker, threads_per_worker=p.threads_per_worker)
