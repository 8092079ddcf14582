"""What the online and offline DPO drivers share beyond `trainers/session/run.py`: placing their
roles, reference logprobs for a pair batch, and the reference refresh (with its resume).

Placement as for GRPO (`baton/trainers/placement/roles.py`): every role on the pool "main" unless
`placement.roles` moves the reference (or, online, the reward) to a pool of its own; the
actor and a rollout engine share a pool (the engine reads the actor's weights in place).
Each role gets only its own sections: `DPOActorWorker(model, actor, dpo, ...)`,
`RolloutWorker(rollout, ...)`, `RewardWorker(reward)`, `ReferenceWorker(model, ...)`.

Reference refresh (`dpo.ref_refresh_every=K`, iterative / SPIN-style): after every K-th
step the reference takes the actor's weights (a state dict through the controller: simple
and exact; for models too large to ship through the driver, a checkpoint-dir transport
would take its place). Once refreshed, the reference is no longer the starting model, so
checkpoints carry its weights in the driver state and a resumed run restores them.
"""

from __future__ import annotations

from typing import Any

from baton.batch import Batch
from baton.controller import build_role_groups
from baton.workers.dpo_actor import DPOActorWorker
from baton.workers.reference import ReferenceWorker
from baton.workers.reward import RewardWorker
from baton.workers.rollout import RolloutWorker

REF_WEIGHTS = "reference_weights"  # driver-state key: the refreshed reference's state dict


def build_dpo_roles(cfg: Any, *, temperature: float, probe_prompt: str, task: str) -> dict[str, Any]:
    """{role: WorkerGroup} for the roles `cfg.roles` names (a DPOConfig or OfflineDPOConfig).
    `temperature`: the one actor and reference logprobs are taken at (online: the rollout's;
    offline: 1)."""
    r, a = cfg.rollout, cfg.actor
    classes = {  # the actor first: a colocated rollout engine takes its Policy handle
        "actor": (DPOActorWorker, (cfg.model, a, cfg.dpo),
                  dict(temperature=temperature, max_new_tokens=r.max_new_tokens,
                       total_steps=cfg.trainer.steps, seed=cfg.trainer.seed)),
        "rollout": (RolloutWorker, (r,), dict(task=task, seed=cfg.trainer.seed, probe_prompt=probe_prompt,
                                              verifier_timeout_s=getattr(getattr(cfg, "reward", None), "timeout_s", 5.0))),
        "reward": (RewardWorker, (getattr(cfg, "reward", None),), {}),
        "reference": (ReferenceWorker, (cfg.model,),
                      dict(temperature=temperature, micro_batch_size=a.micro_batch_size, bf16=a.bf16)),
    }
    classes = {role: classes[role] for role in ("actor", "rollout", "reward", "reference") if role in cfg.roles}
    p = cfg.placement
    return build_role_groups(p.pool_specs(), {role: p.pool_of(role) for role in classes}, classes,
                             backend=p.backend, cpus_per_worker=p.cpus_per_worker,
                             gpus_per_worker=p.gpus_per_worker, threads_per_worker=p.threads_per_worker)


def with_ref_logprobs(ref: Any, pairs: Batch) -> Batch:
    """The pair batch with the reference's `ref_logprobs` [B, R] (unchanged if reference-free)."""
    return pairs if ref is None else pairs.union(ref.compute_ref_logprobs(pairs).get())


def maybe_refresh_reference(roles: dict[str, Any], every: int, step: int) -> bool:
    """After every `every`-th step, copy the actor's weights into the reference."""
    if not every or step % every or "reference" not in roles:
        return False
    roles["reference"].load_weights(roles["actor"].get_weights())
    return True


def reference_state(roles: dict[str, Any], every: int, step: int) -> dict[str, Any]:
    """Driver-state entries for a checkpoint at `step`: the reference's weights once a
    refresh has replaced the starting model."""
    if every and step >= every and "reference" in roles:
        return {REF_WEIGHTS: roles["reference"].get_weights()}
    return {}


def restore_reference(roles: dict[str, Any], saved: dict[str, Any]) -> None:
    if REF_WEIGHTS in saved and "reference" in roles:
        roles["reference"].load_weights(saved[REF_WEIGHTS])
