"""The typed config of a PPO-family run (`baton.trainers.ppo`: GRPO, Dr. GRPO, DAPO, RLOO,
REINFORCE++, ReMax, GSPO, PPO with a critic and GAE, on-policy distillation), assembled from
the sections that live next to what they configure:

    algorithm     grpo | ppo: the family's name (`baton train` picks this driver for both);
                  it only sets the default `algo.advantage` (grpo -> grpo, ppo -> gae)
    model         baton.models.config.ModelConfig            actor, reference (critic default path)
    data          baton.trainers.session.config.DataConfig       where rows come from (data.source)
    rollout       baton.workers.rollout.RolloutConfig        rollout / generator
    reward        baton.workers.reward.RewardConfig          reward (functions: {} = none)
    reward_model  baton.workers.reward_model.RewardModelConfig | null   reward_model
    algo          baton.algos.config.AlgoConfig              the driver (advantages, KL in the
                                                             reward, off-policy correction,
                                                             DAPO) and the actor (its loss)
    actor         baton.workers.actor.ActorConfig            actor
    critic        baton.workers.critic.CriticConfig | null   critic (present = on)
    teacher       baton.workers.teacher.TeacherConfig | null teacher (on-policy distillation:
                                                             algo.advantage=distill)
    placement     baton.controller.placement.PlacementConfig
    trainer       RLTrainerConfig: TrainerConfig + check_weight_sync, mode, max_staleness

Roles are switched on by config, and every combination that makes sense runs: any
estimator with any row source (this run's rollout colocated, a generator running ahead,
the trajectory API), a critic or not, a reward model or not, KL in the loss or in the
reward, one off-policy correction by name. A combination that cannot run is refused here,
one line naming the keys, before anything is loaded or written.

`trainer.mode` (sync | one_step_off | async) decides whether generation overlaps the update:
the overlapping modes need the rollout on a pool of its own; unless `placement.roles` places
it, the placement step (`baton.trainers.placement.generator`, beside `placement.auto`) moves
the rollout and the reward to the pool "gen" (1 worker), which runs on Ray even when
`placement.backend=local` (the actor then stays in the driver's process); the checks here
only check.
`trainer.max_staleness` is the one staleness bound: how many versions a generator may run
ahead (mode async, default 2), or the oldest group the trajectory API may serve
(data.source=api; unset = no bound). Sizes: `data.prompts_per_step` prompts x `rollout.n`
samples = the rows of one step; `actor.mini_batch_size` and `actor.micro_batch_size` count
rows across all data-parallel ranks.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Literal

from baton.config import LOAD_STEPS
from baton.models.moe import dense_on_disk
from baton.agents.config import AgentConfig, GatewayAgentConfig
from baton.algos import ADVANTAGES, estimator_needs
from baton.algos.config import (AlgoConfig, check_advantage_needs, check_algo_dependencies, check_algo_names,
                                check_algo_ranges)
from baton.controller.placement import PlacementConfig
from baton.models.config import ModelConfig
from baton.services.launch import entry_group_size
from baton.sources import SourceSpec, source_spec, unread_keys
from baton.trainers.placement.generator import GEN_POOL, place_generator, placed_pools
from baton.trainers.role_specs import ROLES
from baton.trainers.session.config import DataConfig, RolloutTrainerConfig
from baton.workers.actor import ActorConfig
from baton.workers.critic import CriticConfig
from baton.workers.reward import RewardConfig
from baton.workers.reward_model import RewardModelConfig
from baton.workers.rollout import RolloutConfig
from baton.workers.teacher import TeacherConfig

DEFAULT_ADVANTAGE = {"grpo": "grpo", "ppo": "gae"}


@dataclass
class RLTrainerConfig(RolloutTrainerConfig):
    """The `trainer:` section of a PPO-family run: TrainerConfig plus how generation and the
    update overlap (see baton.sources.ahead):

        sync          the rows of step s are sampled by the weights of step s-1 (age 0)
        one_step_off  the generator samples step s+1 while the trainer trains on step s (age 1)
        async         the generator runs up to `max_staleness` steps ahead (age <= max_staleness)
    """
    mode: Literal["sync", "one_step_off", "async"] = "sync"
    # versions a row may be older than the trainer: the generator's bound (async's default: 2),
    # or the oldest group the trajectory API serves with data.source=api (unset: no bound)
    max_staleness: int | None = None

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
        fixed = {"one_step_off": 1}.get(mode)
        if k is not None and fixed is not None and k != fixed:
            raise ValueError(f"trainer.mode={mode} has max_staleness {fixed}; for a bound of {k} "
                             f"use trainer.mode=async trainer.max_staleness={k}")


@dataclass
class PPOConfig:
    algorithm: Literal["grpo", "ppo"] = "grpo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_model: RewardModelConfig | None = None
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig | None = None
    teacher: TeacherConfig | None = None  # algo.advantage: distill (on-policy distillation)
    agent: AgentConfig | None = None  # data.source: agent (multi-turn episodes with tools)
    gateway: GatewayAgentConfig | None = None  # data.source: gateway (an OpenAI-speaking agent)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    trainer: RLTrainerConfig = field(default_factory=RLTrainerConfig)

    @property
    def roles(self) -> list[str]:
        """The roles this run builds (placement may name only these): the registered roles
        it needs (`baton.trainers.role_specs.ROLES`), in registration order."""
        return [name for name, spec in ROLES.items() if spec.needed(self)]

    @property
    def scored(self) -> bool:
        """Whether the step's rows carry a task reward: a reward role scores them, or the
        source's rows arrive scored (`SourceSpec.scored`)."""
        return "reward" in self.roles or self.source.scored

    @property
    def remax(self) -> bool:
        """Whether the rollout also samples one greedy response per prompt (its reward is the
        ReMax baseline)."""
        return estimator_needs(self.algo.advantage).baseline

    @property
    def pretrain_steps(self) -> int:
        """Trainer steps in which the critic trains alone (the actor and the engine wait)."""
        return self.critic.pretrain_steps if self.critic is not None else 0

    def __post_init__(self) -> None:
        if not self.algo.advantage:
            self.algo.advantage = DEFAULT_ADVANTAGE[self.algorithm]
        for section in (self.data, self.rollout, self.actor, self.trainer):
            section.check()
        if self.reward.functions:
            self.reward.check()
        elif self.reward_model is None and not self.source.scored and self._reads_reward:
            raise ValueError("reward.functions is empty and there is no reward_model: nothing scores the rollouts")
        for section in (self.reward_model, self.critic, self.teacher, self.agent, self.gateway):
            if section is not None:
                section.check()
        if self.gateway is not None:
            self.gateway.check_task(self.data.task)
        self._check_algo()
        self._check_sources()
        self._check_generator()  # and the placement, as the placement step will write it
        self._check_weight_sync()
        self._check_sizes()

    @property
    def _reads_reward(self) -> bool:
        """Whether the estimator reads a task reward (distill with task_reward_coef 0 does not:
        its teacher is the signal; a reward given then is scored for the metrics only)."""
        name = self.algo.advantage  # an unknown name is _check_algo's to refuse
        return name not in ADVANTAGES or estimator_needs(name).reads_reward(self.algo)

    def _check_algo(self) -> None:
        a, n = self.algo, self.rollout.n
        check_algo_names(a)
        check_algo_ranges(a)
        check_algo_dependencies(a)
        check_advantage_needs(a.advantage, critic=self.critic is not None, teacher=self.teacher is not None)
        groups = estimator_needs(a.advantage).compares_groups(a)  # it compares the samples of a prompt
        if groups or a.dynamic_sampling:
            what = f"algo.advantage={a.advantage!r}" if groups else "algo.dynamic_sampling"
            if n < 2:
                raise ValueError(f"{what} compares the samples of a prompt: rollout.n={n} gives every "
                                 f"group one sample (use rollout.n >= 2)")
            if self.rollout.temperature == 0:
                raise ValueError(f"rollout.temperature=0 makes the {n} samples of a prompt identical "
                                 f"({what} needs them to differ; use a temperature > 0)")
        if a.overlong_buffer > self.rollout.max_new_tokens:
            raise ValueError(f"algo.overlong_buffer={a.overlong_buffer} exceeds rollout.max_new_tokens="
                             f"{self.rollout.max_new_tokens}")
        if self.rollout.routing_replay and self.data.source != "rollout":
            raise ValueError(f"rollout.routing_replay records the experts in this run's own engine (data.source=rollout); "
                             f"rows from data.source={self.data.source} arrive without them")
        moe_keys = [k for k, on in (("actor.router_aux_loss_coef", self.actor.router_aux_loss_coef),
                                    ("rollout.routing_replay", self.rollout.routing_replay)) if on]
        if moe_keys and dense_on_disk(self.model.path):
            raise ValueError(f"{' and '.join(moe_keys)}: model.path={self.model.path} is not a mixture of experts "
                             f"(its config.json names no experts)")
        if self.rollout.routing_replay and self.actor.activation_checkpointing:
            raise ValueError("rollout.routing_replay with actor.activation_checkpointing: the backward's recomputed "
                             "forward would route by the trainer's own experts; turn one off")
        if self.pretrain_steps >= self.trainer.steps:
            raise ValueError(f"critic.pretrain_steps={self.pretrain_steps} leaves the actor no step of "
                             f"trainer.steps={self.trainer.steps}")

    @property
    def source(self) -> SourceSpec:
        """The row source this run takes its rows from, as registered (baton.sources.SOURCES)."""
        return source_spec(self)

    def _check_sources(self) -> None:
        """What the chosen row source cannot do, refused by name (its SourceSpec says)."""
        a, d, mode, spec = self.algo, self.data, self.trainer.mode, self.source
        where = f"data.source={d.source}" if d.source != "rollout" else f"trainer.mode={mode}" \
            if mode != "sync" else "a rollout on a pool of its own"
        if a.dynamic_sampling and not spec.draws_more:
            raise ValueError(f"algo.dynamic_sampling draws more prompts until a step is full, which only this "
                             f"run's colocated rollout can do; {where} fixes each step's rows in advance")
        if self.remax and not spec.greedy_baseline:
            raise ValueError(f"algo.advantage={a.advantage!r} needs a greedy response per prompt from this "
                             f"run's colocated rollout; {where} does not sample one")
        if spec.section and getattr(self, spec.section) is None:
            raise ValueError(f"data.source={d.source} runs what its `{spec.section}:` section describes: "
                             f"give both or neither")
        for key, readers in unread_keys(d.source, self._is_set):  # no section accepted and ignored
            if key == "reward":
                raise ValueError(f"{', '.join(self._reward_keys_set())}: not read with data.source={d.source} (its rows arrive "
                                 f"scored); remove the reward section (a reward_model still adds its score)")
            raise ValueError(f"the `{key}:` section is read only with data.source={'/'.join(readers)} (this run's "
                             f"rows come from data.source={d.source}): remove it, or set data.source={readers[0]}")
        if spec.own_sampling:  # keys that rest: the environments / the agent sample with their own settings
            for key in ("top_p", "top_k", "response_format"):
                if getattr(self.rollout, key) != getattr(RolloutConfig(), key):
                    raise ValueError(f"rollout.{key} is not read with data.source={d.source}: the "
                                     f"{spec.own_sampling} sample(s) with their own settings; remove it")
        for entry in d.envs:  # what `baton launch` starts: a group size of its own would never fill a batch
            flag, size = entry_group_size(entry) or ("", str(self.rollout.n))
            if size != str(self.rollout.n):
                raise ValueError(f"data.envs: {entry!r} sets {flag} {size}, but the trainer compares groups of "
                                 f"rollout.n={self.rollout.n}: drop {flag} (launch passes rollout.n) or set rollout.n")
        if spec.sync_only and mode != "sync":
            raise ValueError(f"trainer.mode={mode} runs this run's own generator ahead of the trainer; with "
                             f"data.source={d.source} the rows come from the {spec.own_sampling or 'outside'} (trainer.max_staleness bounds "
                             f"their age): use trainer.mode=sync")
        if mode == "sync" and not spec.bounds_age and self.trainer.max_staleness not in (None, 0):
            raise ValueError(f"trainer.max_staleness={self.trainer.max_staleness} bounds a generator running ahead "
                             f"(trainer.mode=async) or the trajectory API (data.source=api); this run has neither")

    def _reward_keys_set(self) -> list[str]:
        """The `reward.*` keys the recipe sets (away from their defaults)."""
        defaults = RewardConfig()
        return [f"reward.{k}" for k, v in vars(self.reward).items() if v != getattr(defaults, k)]

    def _is_set(self, key: str) -> bool:
        """Whether the recipe sets section `key` (one only some row sources read)."""
        if key == "reward":
            return bool(self._reward_keys_set())
        return not key.startswith("data.") and getattr(self, key, None) is not None  # data.*: DataConfig.check

    def _check_generator(self) -> None:
        """The overlapping modes run the rollout ahead, on a pool of its own: a rollout placed
        on the actor's pool is refused; one left unplaced is placed by the placement step
        (`baton.trainers.placement.generator`), whose placement `placement.check` checks."""
        p, mode = self.placement, self.trainer.mode
        if not self.source.generator or mode == "sync":  # the registry: the source runs no generator ahead
            p.check(self.roles)
            return
        if self.trainer.staleness >= 2 and self.algo.off_policy == "none":
            warnings.warn(f"trainer.mode={mode} with max_staleness {self.trainer.staleness} and algo.off_policy=none: "
                          f"rows up to {self.trainer.staleness} versions old are clipped against the policy that "
                          f"sampled them (measured on the demo: held-out accuracy 0.68 vs sync's 0.855); "
                          f"algo.off_policy=decoupled_ppo corrects it (0.885) at the cost of one more forward",
                          UserWarning, stacklevel=2)
        if "rollout" in p.roles and p.pool_of("rollout") == p.pool_of("actor"):
            raise ValueError(f"trainer.mode={mode} overlaps generation with the update, so the rollout needs "
                             f"a pool of its own: placement.pools.{GEN_POOL}=1 placement.roles.rollout={GEN_POOL} "
                             f"(or leave placement.roles.rollout unset), or trainer.mode=sync")
        placed = placed_pools(self)
        (dataclasses.replace(p, pools=placed[0], roles=placed[1]) if placed else p).check(self.roles)

    def _check_weight_sync(self) -> None:
        """rollout.weight_sync must reach where the engine is: beside the actor, a generator
        on a pool of its own, or the servers of data.source=api (baton.sync.registry)."""
        p, spec = self.placement, self.source
        where = "servers" if spec.launched else "generator" if spec.generator else "colocated"
        if where == "generator" and p.backend == "local" and self.trainer.mode == "sync" \
                and self.rollout.weight_sync == "broadcast":
            raise ValueError("rollout.weight_sync=broadcast needs the generator in a process of its own: "
                             "placement.backend=ray, or a trainer.mode that overlaps (one_step_off, async)")
        self.rollout.check_sync(where)

    def _check_sizes(self) -> None:
        rows, ws = self.data.prompts_per_step * self.rollout.n, self.placement.world_size
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


LOAD_STEPS[PPOConfig] = place_generator  # load_config places the generator: the one place it happens
