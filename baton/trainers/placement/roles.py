"""Place the roles of a PPO-family run on resource pools, each role given only its own
config sections.

By default every role is colocated on the pool "main" of `placement.world_size` slots: each
slot is one process hosting the actor, the rollout engine (which reads the actor's `Policy`
in place), the reward functions and, when KL is on, the reference; with a PPO config also
the critic, the reward model and a distillation teacher when their sections are present.
`placement.pools` and `placement.roles` move the reward, reference, teacher, critic and/or
reward model to pools of their own (split placement), where their calls run concurrently with the actor's. On the `local` backend every pool is the
driver's own process (world size 1; breakpoints in workers work).

A rollout on a pool other than the actor's (disaggregated; `trainer.mode` one_step_off /
async put it there by default) is a `GeneratorWorker` with its own copy of the model, and
the actor's pool gets one more role, "policy_weights" (`WeightsWorker`, right after the
actor), which serves the actor's weights to it. When generation is to overlap the update
(`trainer.mode` other than sync) and `placement.backend=local`, the generator's pool runs
on Ray all the same: the actor stays in the driver's process and the generator gets one of
its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.controller import build_role_groups
from baton.registry import resolve
from baton.sources import apart
from baton.trainers.role_specs import role_specs
from baton.workers.generator import GeneratorWorker, WeightsWorker

if TYPE_CHECKING:
    from baton.trainers.ppo_config import PPOConfig


def role_classes(cfg: PPOConfig, probe_prompt: str) -> dict[str, tuple]:
    """{role: (worker class, args, kwargs)} of the registered roles `cfg` needs, in
    registration order (the actor first: the colocated rollout engine takes its Policy)."""
    out = {}
    for name, spec in role_specs(cfg.roles):
        args, kwargs = spec.args(cfg, probe_prompt)
        out[name] = (resolve(spec.worker), args, kwargs)
    return out


def build_roles(cfg: PPOConfig, probe_prompt: str) -> dict[str, Any]:
    """{role: WorkerGroup}. `probe_prompt`: the prompt of the weight-sync parity check."""
    r = cfg.rollout
    classes = role_classes(cfg, probe_prompt)
    # LoRA: the reference is the actor's own module with its adapters disabled (no second model)
    lora_reference = cfg.model.lora is not None and classes.pop("reference", None) is not None
    p = cfg.placement
    pools: dict[str, Any] = dict(p.pool_specs())  # the main pool with its mesh, if any
    if apart(cfg):  # the rollout loads its own model; the actor's pool serves it the weights (after the actor)
        classes["rollout"] = (GeneratorWorker, (r,), dict(model=cfg.model, task=cfg.data.task, seed=cfg.trainer.seed,
                                                          probe_prompt=probe_prompt, bf16=cfg.actor.bf16,
                                                          verifier_timeout_s=cfg.reward.timeout_s))
        actor = classes.pop("actor")
        classes = {"actor": actor, "policy_weights": (WeightsWorker,), **classes}
        gen = p.pool_of("rollout")
        if cfg.trainer.mode != "sync" and p.backend == "local":
            spec = pools[gen] if isinstance(pools[gen], dict) else {"world_size": pools[gen]}
            pools[gen] = {**spec, "backend": "ray"}  # overlapping needs a process of its own
    where = {role: p.pool_of("actor" if role == "policy_weights" else role) for role in classes}
    groups = build_role_groups(pools, where, classes,
                               backend=p.backend, cpus_per_worker=p.cpus_per_worker,
                               gpus_per_worker=p.gpus_per_worker, threads_per_worker=p.threads_per_worker)
    if lora_reference:  # ActorWorker.compute_ref_logprobs: the base, adapters off
        groups["reference"] = groups["actor"]
    return groups

