"""The placement step's other half, beside `placement.auto`: a generator ahead gets a pool.

    cfg = place_generator(cfg)   # load_recipe and the PPO driver do this; config checks only check

The overlapping `trainer.mode`s (one_step_off, async) run the rollout as a generator ahead of
the trainer, on a pool of its own. When the recipe does not place the rollout
(`placement.roles.rollout`), the rollout and the reward (unless placed) move to the pool
"gen" (1 worker, unless `placement.pools.gen` sizes it), which runs on Ray even when
`placement.backend=local`. The config's own check (`PPOConfig`) refuses a rollout placed on
the actor's pool and checks the placement as this step will write it (`placed_pools`).
"""

from __future__ import annotations

import copy
from typing import Any

GEN_POOL = "gen"  # where the overlapping modes put the rollout unless placement.roles says


def placed_pools(cfg: Any) -> tuple[dict[str, int], dict[str, str]] | None:
    """(pools, roles) of `cfg.placement` with the generator placed, or None when there is
    nothing to place: the row source runs no generator ahead (`SourceSpec.generator`), the
    mode is sync, or the recipe places the rollout itself."""
    p = cfg.placement
    if not cfg.source.generator or cfg.trainer.mode == "sync" or "rollout" in p.roles:
        return None
    pools, roles = dict(p.pools), dict(p.roles)
    pools.setdefault(GEN_POOL, 1)
    roles["rollout"] = GEN_POOL
    if "reward" in cfg.roles:
        roles.setdefault("reward", GEN_POOL)
    return pools, roles


def place_generator(cfg: Any) -> Any:
    """`cfg` with the generator placed (a copy; `cfg` itself when there is nothing to place,
    or for a config without a row source: the DPO and SFT drivers')."""
    if not hasattr(type(cfg), "source") or not hasattr(cfg, "placement"):
        return cfg
    placed = placed_pools(cfg)
    if placed is None:
        return cfg
    out = copy.deepcopy(cfg)
    out.placement.pools, out.placement.roles = placed
    return out


__all__ = ["GEN_POOL", "place_generator", "placed_pools"]
