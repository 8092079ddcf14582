"""The placement step's other half, beside `placement.auto`: a generator ahead gets a pool.

    cfg = place_generator(cfg)   # load_config's step for PPOConfig; config checks only check
    check_placed(cfg)            # the PPO driver: a config that skipped the step is refused

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

from baton.config import ConfigError

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


def check_placed(cfg: Any) -> None:
    """Refuse a config with a generator left to place: built as `PPOConfig(...)` rather than
    loaded (`load_config` places; the driver does not place again)."""
    if placed_pools(cfg) is not None:
        raise ConfigError(f"trainer.mode={cfg.trainer.mode} runs the rollout on a pool of its own, and this config "
                          f"was not placed: build it with load_config (or place_generator(cfg))")


__all__ = ["GEN_POOL", "check_placed", "place_generator", "placed_pools"]
