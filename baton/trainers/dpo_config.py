"""The typed configs of DPO runs, assembled from the sections that live next to what they
configure (as `PPOConfig` is):

    model      baton.models.config.ModelConfig           actor, reference
    data       baton.trainers.session.config.DataConfig      online: the prompt sampler
               PairDataConfig (below)                    offline: the jsonl of pairs
    rollout    baton.workers.rollout.RolloutConfig       online: the sample generator
                                                         offline: held-out evaluation only
    reward     baton.workers.reward.RewardConfig         online: the scorer
    dpo        baton.algos.dpo_config.DPOLossConfig         the loss (actor), pairing and
                                                         reference refresh (drivers)
    actor      baton.workers.actor.ActorConfig           actor
    placement  baton.controller.placement.PlacementConfig
    trainer    baton.trainers.session.config.TrainerConfig

`__post_init__` checks every name against its registry and every range, so a bad recipe is
one line and exit code 2 before anything loads. Sizes: `actor.mini_batch_size` and
`actor.micro_batch_size` count rows across data-parallel ranks, as everywhere: two rows per
pair, so they must be even (a pair is never split), and a mini-batch must give every rank
whole pairs. Online, the number of pairs per step varies (ties are dropped): with
`mini_batch_size=0` (the default) one optimizer step takes them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from baton.algos.dpo_config import DPOLossConfig
from baton.controller.placement import PlacementConfig
from baton.envs import TASKS
from baton.models.config import ModelConfig
from baton.sources import data_sources
from baton.trainers.session.config import DataConfig, RolloutTrainerConfig, TrainerConfig
from baton.workers.actor import ActorConfig
from baton.workers.reward import RewardConfig
from baton.workers.rollout import RolloutConfig


def _check_actor(actor: ActorConfig, world_size: int) -> None:
    if actor.router_aux_loss_coef:
        raise ValueError(f"actor.router_aux_loss_coef={actor.router_aux_loss_coef}: the routers' load-balancing "
                         f"loss joins the policy-gradient losses (grpo, ppo), not DPO's")
    if actor.micro_batch_size % 2 or actor.mini_batch_size % 2:
        raise ValueError(f"actor.micro_batch_size={actor.micro_batch_size} and actor.mini_batch_size="
                         f"{actor.mini_batch_size} count rows, two per pair: both must be even")
    if actor.mini_batch_size % (2 * world_size):
        raise ValueError(f"actor.mini_batch_size={actor.mini_batch_size} must give each of the "
                         f"placement.world_size={world_size} ranks whole pairs (a multiple of {2 * world_size})")


def _roles(dpo: DPOLossConfig, *roles: str) -> list[str]:
    return [r for r in roles if r != "reference" or not dpo.reference_free]


@dataclass
class DPOConfig:
    """Online DPO: generate -> score -> pair -> reference -> update (baton/trainers/online_dpo.py)."""
    algorithm: Literal["online_dpo"] = "online_dpo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    dpo: DPOLossConfig = field(default_factory=DPOLossConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    trainer: RolloutTrainerConfig = field(default_factory=lambda: RolloutTrainerConfig(run_dir="runs/online_dpo"))

    @property
    def roles(self) -> list[str]:
        return _roles(self.dpo, "actor", "rollout", "reward", "reference")

    def __post_init__(self) -> None:
        for section in (self.data, self.rollout, self.reward, self.dpo, self.actor, self.trainer):
            section.check()
        readable = data_sources("online_dpo")  # the row sources that declare this driver
        if self.data.source not in readable:
            raise ValueError(f"data.source={self.data.source}: online DPO pairs its own samples (data.source="
                             f"{'/'.join(readable)})")
        if self.rollout.routing_replay:
            raise ValueError("rollout.routing_replay replays the engine's experts in policy-gradient updates (grpo, "
                             "ppo); online DPO's pairs do not carry them")
        if self.rollout.n < 2:
            raise ValueError(f"online DPO pairs the samples of a prompt: rollout.n={self.rollout.n} "
                             f"makes no pair (use rollout.n >= 2)")
        if self.rollout.temperature == 0:
            raise ValueError(f"rollout.temperature=0 makes the {self.rollout.n} samples of a prompt "
                             f"identical: every score ties and no pair is made (use a temperature > 0)")
        self.placement.check(self.roles, same_pool=("actor", "rollout"))
        self.rollout.check_sync("colocated")  # DPO's engine sits beside the actor
        ws = self.placement.world_size
        if self.data.prompts_per_step % ws:
            raise ValueError(f"placement.world_size={ws} must divide data.prompts_per_step="
                             f"{self.data.prompts_per_step}")
        _check_actor(self.actor, ws)


@dataclass
class PairDataConfig:
    """Offline DPO's `data:` section: a jsonl of {"prompt", "chosen", "rejected"} rows."""
    FILE_KIND: ClassVar[str] = "pairs"  # how its files are checked (baton.trainers.session.inputs)
    path: str = ""  # training pairs
    eval_path: str = ""  # held-out pairs: eval/rewards/accuracies, ... at each evaluation ("" = none)
    pairs_per_step: int = 16
    seed: int = 0  # the order of the pairs (a resumable PromptSampler)
    task: str = ""  # also report held-out generation accuracy on this baton.envs task ("" = no)
    eval_size: int = 200  # held-out prompts of `task`

    def check(self) -> None:
        for key in ("path", "eval_path"):
            value = getattr(self, key)
            if (value or key == "path") and not Path(value).is_file():
                raise ValueError(f"data.{key}={value!r} is not a file (a jsonl of prompt/chosen/rejected)")
        if self.task and self.task not in TASKS:
            raise ValueError(f"data.task={self.task!r} is not one of {sorted(TASKS)} (or '' for none)")
        if self.pairs_per_step < 1 or self.eval_size < 1:
            raise ValueError(f"data.pairs_per_step and data.eval_size must be >= 1 "
                             f"(got {self.pairs_per_step}, {self.eval_size})")


@dataclass
class OfflineDPOConfig:
    """Offline DPO from pairs: `baton dpo RECIPE` (baton/trainers/offline_dpo.py)."""
    algorithm: Literal["dpo"] = "dpo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: PairDataConfig = field(default_factory=PairDataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # evaluation on data.task only
    dpo: DPOLossConfig = field(default_factory=DPOLossConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(run_dir="runs/offline_dpo"))

    @property
    def roles(self) -> list[str]:
        return _roles(self.dpo, "actor", "reference", *(["rollout"] if self.data.task else []))

    def __post_init__(self) -> None:
        for section in (self.data, self.rollout, self.dpo, self.actor, self.trainer):
            section.check()
        if self.dpo.pairing != "best_worst" or self.dpo.min_margin:
            raise ValueError("dpo.pairing and dpo.min_margin make pairs from scored samples (online DPO); "
                             "offline pairs come from data.path")
        # the rollout only evaluates data.task: greedy, and 4 samples at rollout.temperature
        for key in ("n", "top_p", "top_k", "response_format", "routing_replay"):
            if getattr(self.rollout, key) != getattr(RolloutConfig(), key):
                raise ValueError(f"rollout.{key} is not read by offline DPO (its rollout only evaluates data.task: "
                                 f"greedy, and 4 samples at rollout.temperature)")
        self.placement.check(self.roles, same_pool=("actor", "rollout") if self.data.task else ())
        self.rollout.check_sync("colocated")  # DPO's engine sits beside the actor
        ws = self.placement.world_size
        if self.data.pairs_per_step % ws:
            raise ValueError(f"placement.world_size={ws} must divide data.pairs_per_step={self.data.pairs_per_step}")
        _check_actor(self.actor, ws)
