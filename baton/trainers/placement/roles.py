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

from typing import Any

from baton.algos.distill import SAMPLED
from baton.controller import build_role_groups
from baton.sources import apart
from baton.trainers.ppo_config import PPOConfig
from baton.workers.actor import ActorWorker
from baton.workers.critic import CriticWorker
from baton.workers.generator import GeneratorWorker, WeightsWorker
from baton.workers.reference import ReferenceWorker
from baton.workers.reward import RewardWorker
from baton.workers.reward_model import RewardModelWorker
from baton.workers.rollout import RolloutWorker
from baton.workers.teacher import TeacherWorker, vocab_rows


def build_roles(cfg: PPOConfig, probe_prompt: str) -> dict[str, Any]:
    """{role: WorkerGroup}. `probe_prompt`: the prompt of the weight-sync parity check."""
    r = cfg.rollout
    wanted = cfg.roles
    classes = {  # the actor first: the colocated rollout engine takes its Policy handle
        "actor": (ActorWorker, (cfg.model, cfg.actor, cfg.algo),
                  dict(temperature=r.temperature, max_new_tokens=r.max_new_tokens,
                       total_steps=cfg.trainer.steps, seed=cfg.trainer.seed)),
        "rollout": (RolloutWorker, (r,), dict(task=cfg.data.task, seed=cfg.trainer.seed, probe_prompt=probe_prompt,
                                              verifier_timeout_s=cfg.reward.timeout_s,
                                              # data.source=api: rollout.weight_sync is the servers'; this
                                              # engine only evaluates, beside the actor
                                              **({"weight_sync": "auto"} if cfg.data.source == "api" else {}))),
        "reward": (RewardWorker, (cfg.reward,), {}),
        "reference": (ReferenceWorker, (cfg.model,),
                      dict(temperature=r.temperature, micro_batch_size=cfg.actor.micro_batch_size,
                           strategy=cfg.actor.strategy, bf16=cfg.actor.bf16)),  # logprobs in the actor's precision
    }
    if cfg.reward_model is not None:
        classes["reward_model"] = (RewardModelWorker, (cfg.reward_model,), {})
    if cfg.teacher is not None:  # the reference's machinery on the teacher's model
        classes["teacher"] = (TeacherWorker, (cfg.teacher,),
                              dict(temperature=r.temperature, micro_batch_size=cfg.actor.micro_batch_size,
                                   strategy=cfg.actor.strategy,
                                   topk=None if cfg.algo.distill_loss == SAMPLED else cfg.algo.distill_topk,
                                   vocab_size=vocab_rows(cfg.model.path)))
    if cfg.critic is not None:
        classes["critic"] = (CriticWorker, (cfg.critic, cfg.model),
                             dict(total_steps=cfg.trainer.steps, seed=cfg.trainer.seed,
                                  max_new_tokens=r.max_new_tokens))
    classes = {role: entry for role, entry in classes.items() if role in wanted}
    # LoRA: the reference is the actor's own module with its adapters disabled (no second model)
    lora_reference = cfg.model.lora is not None and classes.pop("reference", None) is not None
    p = cfg.placement
    pools: dict[str, Any] = dict(p.pool_specs())  # the main pool with its mesh, if any
    if apart(cfg):  # the rollout loads its own model; the actor's pool serves it the weights
        classes["rollout"] = (GeneratorWorker, (r,), dict(model=cfg.model, task=cfg.data.task, seed=cfg.trainer.seed,
                                                          probe_prompt=probe_prompt, bf16=cfg.actor.bf16,
                                                          verifier_timeout_s=cfg.reward.timeout_s))
        classes = {**{k: v for k, v in classes.items() if k == "actor"}, "policy_weights": (WeightsWorker,),
                   **{k: v for k, v in classes.items() if k != "actor"}}
        gen = p.pool_of("rollout")
        if getattr(cfg.trainer, "mode", "sync") != "sync" and p.backend == "local":
            spec = pools[gen] if isinstance(pools[gen], dict) else {"world_size": pools[gen]}
            pools[gen] = {**spec, "backend": "ray"}  # overlapping needs a process of its own
    where = {role: p.pool_of("actor" if role == "policy_weights" else role) for role in classes}
    groups = build_role_groups(pools, where, classes,
                               backend=p.backend, cpus_per_worker=p.cpus_per_worker,
                               gpus_per_worker=p.gpus_per_worker, threads_per_worker=p.threads_per_worker)
    if lora_reference:  # ActorWorker.compute_ref_logprobs: the base, adapters off
        groups["reference"] = groups["actor"]
    return groups

