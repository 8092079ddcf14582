"""The typed config of a GRPO run (and its PPO-family relatives), assembled from the
sections that live next to what they configure:

    model      baton.models.config.ModelConfig       actor, reference
    data       baton.trainers.run_config.DataConfig  the driver's prompt sampler
    rollout    baton.workers.rollout.RolloutConfig   rollout
    reward     baton.workers.reward.RewardConfig     reward
    algo       baton.algos.config.AlgoConfig         the driver (advantage), the actor (loss)
    actor      baton.workers.actor.ActorConfig       actor
    placement  baton.controller.placement.PlacementConfig
    trainer    baton.trainers.run_config.TrainerConfig

A recipe YAML mirrors these dataclasses; `baton.config.load_config` checks every key and
type, then `GRPOConfig.__post_init__` checks every name against its registry and every
range, before anything is loaded or written. Sizes: `data.prompts_per_step` prompts x
`rollout.n` samples = the rows of one step; `actor.mini_batch_size` and
`actor.micro_batch_size` count rows across all data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class GRPOConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

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
        self.placement.check(ROLES, same_pool=("actor", "rollout"))
        rows = self.data.prompts_per_step * self.rollout.n
        mini = self.actor.mini_batch_size or rows
        ws = self.placement.world_size
        if rows % mini:
            raise ValueError(f"actor.mini_batch_size={mini} must divide the step's {rows} rows "
                             f"(data.prompts_per_step x rollout.n)")
        if mini % ws or self.data.prompts_per_step % ws:
            raise ValueError(f"placement.world_size={ws} must divide actor.mini_batch_size={mini} "
                             f"and data.prompts_per_step={self.data.prompts_per_step}")
