"""The typed config of a GRPO run (and its PPO-family relatives), assembled from the
sections that live next to what they configure:

    model      baton.models.config.ModelConfig       actor, reference
    data       baton.trainers.run_config.DataConfig  the driver's prompt sampler
    rollout    baton.workers.rollout.RolloutConfig   rollout
    reward     baton.workers.reward.RewardConfig     reward
    algo       baton.algos.config.AlgoConfig         the driver (advantage), the actor (loss)
    actor      baton.workers.actor.ActorConfig       actor
    placement  baton.controller.placement.PlacementConfig
    trainer    GRPOTrainerConfig: TrainerConfig + mode / max_staleness (async_source.py)

A recipe YAML mirrors these dataclasses; `baton.config.load_config` checks every key and
type, then `GRPOConfig.__post_init__` checks every name against its registry and every
range, before anything is loaded or written. Sizes: `data.prompts_per_step` prompts x
`rollout.n` samples = the rows of one step; `actor.mini_batch_size` and
`actor.micro_batch_size` count rows across all data-parallel ranks.

`trainer.mode` (sync | one_step_off | async) decides whether generation overlaps the update:
the overlapping modes need the rollout on a pool of its own; unless `placement.roles` places
it, the rollout and the reward move to the pool "gen" (1 worker), which runs on Ray even
when `placement.backend=local` (the actor then stays in the driver's process).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

from baton.algos.config import AlgoConfig, check_advantage_inputs, check_algo_names
from baton.controller.placement import PlacementConfig
from baton.models.config import ModelConfig
from baton.trainers.run_config import DataConfig, TrainerConfig
from baton.workers.actor import ActorConfig
from baton.workers.reward import RewardConfig
from baton.workers.rollout import RolloutConfig

ROLES = ["actor", "rollout", "reward", "reference"]
# What the GRPO driver hands an advantage estimator (no critic: no values).
ADVANTAGE_INPUTS = {"scores", "response_mask", "group_size", "group_index", "token_rewards"}
GROUP_ESTIMATORS = {"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"}  # baseline = the group
GEN_POOL = "gen"  # where the overlapping modes put the rollout unless placement.roles says


@dataclass
class GRPOTrainerConfig(TrainerConfig):
    """The `trainer:` section of a GRPO run: TrainerConfig plus how generation and the
    update overlap (see baton.trainers.async_source):

        sync          the rows of step s are sampled by the weights of step s-1 (age 0)
        one_step_off  the generator samples step s+1 while the trainer trains on step s (age 1)
        async         the generator runs up to `max_staleness` steps ahead (age <= max_staleness)
    """
    mode: Literal["sync", "one_step_off", "async"] = "sync"
    max_staleness: int | None = None  # versions the generator may run ahead; async's default: 2
    # how a generator on its own pool gets the actor's weights (baton.workers.generator)
    weight_sync: Literal["object_store", "broadcast"] = "object_store"

    @property
    def staleness(self) -> int:
        """k: the rows of step s are sampled by weights version max(0, s - 1 - k)."""
        if self.mode == "sync":
            return 0
        if self.mode == "one_step_off":
            return 1
        return 2 if self.max_staleness is None else self.max_staleness

    def check(self) -> None:
        super().check()
        k, mode = self.max_staleness, self.mode
        if k is not None and k < 0:
            raise ValueError(f"trainer.max_staleness must be >= 0, got {k}")
        fixed = {"sync": 0, "one_step_off": 1}.get(mode)
        if k is not None and fixed is not None and k != fixed:
            raise ValueError(f"trainer.mode={mode} has max_staleness {fixed}; for a bound of {k} "
                             f"use trainer.mode=async trainer.max_staleness={k}")


@dataclass
class GRPOConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    trainer: GRPOTrainerConfig = field(default_factory=GRPOTrainerConfig)

    def __post_init__(self) -> None:
        for section in (self.data, self.rollout, self.reward, self.actor, self.trainer):
            section.check()
        check_algo_names(self.algo)
        check_advantage_inputs(self.algo.advantage, ADVANTAGE_INPUTS)
        if self.algo.advantage in GROUP_ESTIMATORS:
            if self.rollout.n < 2:
                raise ValueError(f"algo.advantage={self.algo.advantage!r} compares the samples of a prompt: "
                                 f"rollout.n={self.rollout.n} gives every advantage 0 (use rollout.n >= 2)")
            if self.rollout.temperature == 0:
                raise ValueError(f"rollout.temperature=0 makes the {self.rollout.n} samples of a prompt identical: "
                                 f"every {self.algo.advantage!r} advantage is 0 (use a temperature > 0)")
        if self.algo.kl_coef < 0 or self.algo.entropy_coef < 0:
            raise ValueError("algo.kl_coef and algo.entropy_coef must be >= 0")
        self._place_generator()
        self.placement.check(ROLES)
        rows = self.data.prompts_per_step * self.rollout.n
        mini = self.actor.mini_batch_size or rows
        ws = self.placement.world_size
        if rows % mini:
            raise ValueError(f"actor.mini_batch_size={mini} must divide the step's {rows} rows "
                             f"(data.prompts_per_step x rollout.n)")
        if mini % ws or self.data.prompts_per_step % ws:
            raise ValueError(f"placement.world_size={ws} must divide actor.mini_batch_size={mini} "
                             f"and data.prompts_per_step={self.data.prompts_per_step}")

    def _place_generator(self) -> None:
        """The overlapping modes need the rollout apart from the actor: put it (and the
        reward, unless placed) on the pool "gen" when the recipe does not place it."""
        p, mode = self.placement, self.trainer.mode
        if self.trainer.weight_sync == "broadcast" and (mode == "sync" and p.backend == "local"):
            raise ValueError("trainer.weight_sync=broadcast needs the generator in a process of its own: "
                             "placement.backend=ray, or a trainer.mode that overlaps (one_step_off, async)")
        if mode == "sync":
            return
        if getattr(self.data, "source", "rollout") != "rollout":
            raise ValueError(f"trainer.mode={mode} runs this run's own generator ahead of the trainer; with "
                             f"data.source={self.data.source} the rows come from elsewhere (the API bounds their "
                             f"staleness): use trainer.mode=sync")
        if self.trainer.staleness >= 2 and self.algo.off_policy == "none":
            warnings.warn(f"trainer.mode={mode} with max_staleness {self.trainer.staleness} and algo.off_policy=none: "
                          f"rows up to {self.trainer.staleness} versions old are clipped against the policy that "
                          f"sampled them (measured on the demo: held-out accuracy 0.68 vs sync's 0.855); "
                          f"algo.off_policy=decoupled_ppo corrects it (0.885) at the cost of one more forward",
                          UserWarning, stacklevel=2)
        if "rollout" not in p.roles:
            p.pools.setdefault(GEN_POOL, 1)
            p.roles["rollout"] = GEN_POOL
            p.roles.setdefault("reward", GEN_POOL)
        elif p.pool_of("rollout") == p.pool_of("actor"):
            raise ValueError(f"trainer.mode={mode} overlaps generation with the update, so the rollout needs "
                             f"a pool of its own: placement.pools.{GEN_POOL}=1 placement.roles.rollout={GEN_POOL} "
                             f"(or leave placement.roles.rollout unset), or trainer.mode=sync")
