"""The colocated actor + rollout roles on a tiny model (local backend), shared by the tests of
the rollout role's engine (its dtype, its sleep, its own copy of the weights)."""

from __future__ import annotations


def colocated_roles(tmp_path_factory, *overrides: str):
    """(groups, pool) of an actor and a rollout role on a 0.75M model, 2 samples of 4 tokens;
    `overrides`: recipe keys (e.g. "actor.bf16=true")."""
    from baton.config import load_config
    from baton.controller import ResourcePool, colocated_groups
    from baton.models.make import make_tiny_checkpoint
    from baton.trainers.ppo_config import PPOConfig
    from baton.workers.actor import ActorWorker
    from baton.workers.rollout import RolloutConfig, RolloutWorker

    model_dir = str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=1))
    cfg = load_config(PPOConfig, overrides=[f"model.path={model_dir}", "rollout.n=2", *overrides])
    pool = ResourcePool(1, backend="local", threads_per_worker=1)
    groups = colocated_groups(pool, {
        "actor": (ActorWorker, (cfg.model, cfg.actor, cfg.algo),
                  dict(temperature=1.0, max_new_tokens=4, total_steps=2, seed=0)),
        "rollout": (RolloutWorker, (RolloutConfig(n=2, max_new_tokens=4),),
                    dict(task="arithmetic", seed=0, probe_prompt="12+34="))})
    return groups, pool
