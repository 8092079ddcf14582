"""The typed config of a PPO-family run (`baton.trainers.ppo`), assembled from the sections
that live next to what they configure:

    algorithm     "ppo": selects this driver in `baton train` (see baton/cli.py)
    model         baton.models.config.ModelConfig            actor, reference (critic default path)
    data          baton.trainers.run_config.DataConfig       the driver's prompt sampler
    rollout       baton.workers.rollout.RolloutConfig        rollout
    reward        baton.workers.reward.RewardConfig          reward (functions: {} = none)
    reward_model  baton.workers.reward_model.RewardModelConfig | null   reward_model
    algo          baton.algos.config.AlgoConfig              the driver, the actor (loss)
    actor         baton.workers.actor.ActorConfig            actor
    critic        baton.workers.critic.CriticConfig | null   critic (present = on)
    placement     baton.controller.placement.PlacementConfig
    trainer       baton.trainers.run_config.TrainerConfig

One driver covers the family: PPO with a critic (`critic:` + `algo.advantage: gae`), and the
critic-less estimators (grpo, dr_grpo, rloo, remax, reinforce_pp, ...), with GSPO / DAPO /
TIS options by name. `__post_init__` checks every name and range and the cross-section
rules below before anything is loaded or written, so a bad recipe is one line, exit 2:
`gae` without a critic, a critic no estimator reads, TIS without recomputed old logprobs,
group estimators with one sample per prompt, batch sizes that do not divide.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Literal

from baton.algos import ADVANTAGES
from baton.algos.config import AlgoConfig, check_advantage_inputs, check_algo_names, check_algo_ranges
from baton.controller.placement import PlacementConfig
from baton.models.config import ModelConfig
from baton.trainers.run_config import DataConfig, TrainerConfig
from baton.workers.actor import ActorConfig
from baton.workers.critic import CriticConfig
from baton.workers.reward import RewardConfig
from baton.workers.reward_model import RewardModelConfig
from baton.workers.rollout import RolloutConfig

# What the PPO driver can hand an advantage estimator: values only with a critic;
# baseline_scores (the greedy sample's reward, ReMax) whenever the estimator asks.
BASE_INPUTS = {"scores", "response_mask", "group_index", "token_rewards", "baseline_scores"}
GROUP_ESTIMATORS = {"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"}  # baseline = the group


def estimator_reads(name: str, what: str) -> bool:
    return what in inspect.signature(ADVANTAGES[name]).parameters


@dataclass
class PPOConfig:
    algorithm: Literal["ppo"] = "ppo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_model: RewardModelConfig | None = None
    algo: AlgoConfig = field(default_factory=lambda: AlgoConfig(advantage="gae"))
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig | None = None
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(run_dir="runs/ppo"))

    @property
    def roles(self) -> list[str]:
        """The roles this run builds (placement may name only these)."""
        out = ["actor", "rollout"]
        if self.reward.functions:
            out.append("reward")
        if self.reward_model is not None:
            out.append("reward_model")
        if self.algo.kl_coef > 0 or self.algo.kl_in_reward:
            out.append("reference")
        if self.critic is not None:
            out.append("critic")
        return out

    @property
    def remax(self) -> bool:
        """Whether the rollout also samples one greedy response per prompt (its reward is the
        ReMax baseline)."""
        return estimator_reads(self.algo.advantage, "baseline_scores")

    def __post_init__(self) -> None:
        for section in (self.data, self.rollout, self.actor, self.trainer):
            section.check()
        if self.reward.functions:
            self.reward.check()
        elif self.reward_model is None:
            raise ValueError("reward.functions is empty and there is no reward_model: nothing scores the rollouts")
        if self.reward_model is not None:
            self.reward_model.check()
        if self.critic is not None:
            self.critic.check()
        a, n = self.algo, self.rollout.n
        check_algo_names(a)
        check_algo_ranges(a)
        check_advantage_inputs(a.advantage, BASE_INPUTS | ({"values"} if self.critic is not None else set()))
        if self.critic is not None and not estimator_reads(a.advantage, "values"):
            raise ValueError(f"critic: section given but algo.advantage={a.advantage!r} does not use values; "
                             f"use algo.advantage=gae or drop the critic section")
        if a.advantage in GROUP_ESTIMATORS or a.dynamic_sampling:
            what = f"algo.advantage={a.advantage!r}" if a.advantage in GROUP_ESTIMATORS else "algo.dynamic_sampling"
            if n < 2:
                raise ValueError(f"{what} compares the samples of a prompt: rollout.n={n} gives every "
                                 f"group one sample (use rollout.n >= 2)")
            if self.rollout.temperature == 0:
                raise ValueError(f"rollout.temperature=0 makes the {n} samples of a prompt identical "
                                 f"({what} needs them to differ; use a temperature > 0)")
        if a.tis_cap is not None and not a.recompute_old_logprobs:
            raise ValueError("algo.tis_cap needs algo.recompute_old_logprobs=true: otherwise the old logprobs "
                             "are the engine's and every truncated-IS weight is 1")
        if a.overlong_buffer > self.rollout.max_new_tokens:
            raise ValueError(f"algo.overlong_buffer={a.overlong_buffer} exceeds rollout.max_new_tokens="
                             f"{self.rollout.max_new_tokens}")
        if self.critic is not None and self.critic.pretrain_steps >= self.trainer.steps:
            raise ValueError(f"critic.pretrain_steps={self.critic.pretrain_steps} leaves the actor no step of "
                             f"trainer.steps={self.trainer.steps}")
        self.placement.check(self.roles, same_pool=("actor", "rollout"))
        rows, ws = self.data.prompts_per_step * n, self.placement.world_size
        if self.data.prompts_per_step % ws:
            raise ValueError(f"placement.world_size={ws} must divide data.prompts_per_step={self.data.prompts_per_step}")
        sections = [("actor", self.actor.mini_batch_size, ws)]
        if self.critic is not None:
            sections.append(("critic", self.critic.mini_batch_size,
                             self.placement.pool_sizes()[self.placement.pool_of("critic")]))
        for name, mini, dp in sections:
            mini = mini or rows
            if rows % mini:
                raise ValueError(f"{name}.mini_batch_size={mini} must divide the step's {rows} rows "
                                 f"(data.prompts_per_step x rollout.n)")
            if mini % dp:
                raise ValueError(f"{name}.mini_batch_size={mini} must be divisible by the {dp} ranks of its pool")
