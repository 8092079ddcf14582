"""The typed config of a GRPO run (and its PPO-family relatives), section by section.

A recipe YAML mirrors these dataclasses; `baton.config.load_config` checks every key and type.
Sizes: `data.prompts_per_step` prompts x `rollout.n` samples = the rows of one step;
`actor.mini_batch_size` and `actor.micro_batch_size` count rows across all data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ModelConfig:
    path: str = "checkpoints/arith-sft"  # a local HF directory (model + tokenizer)
    dtype: Literal["float32", "bfloat16"] = "float32"  # storage dtype of the weights


@dataclass
class DataConfig:
    task: str = "arithmetic"  # a name in baton.envs.TASKS
    prompts_per_step: int = 16
    eval_size: int = 200  # held-out prompts for evaluation
    seed: int = 0


@dataclass
class RolloutConfig:
    n: int = 8  # samples per prompt (the GRPO group size)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16


@dataclass
class RewardConfig:
    functions: dict[str, float] = field(default_factory=lambda: {"arithmetic/correct": 1.0})
    timeout_s: float = 5.0


@dataclass
class AlgoConfig:
    advantage: str = "grpo"  # a name in baton.algos.ADVANTAGES ("grpo", "dr_grpo", "rloo", ...)
    policy_loss: str = "ppo_clip"
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO clip-higher
    dual_clip: float | None = None  # e.g. 3.0: caps the loss of negative-advantage tokens
    kl_coef: float = 0.0  # > 0 adds KL(policy || reference) as a loss term and loads a reference
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = 0.0
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    # Use the engine's behaviour logprobs as the PPO "old" logprobs (exact in fp32, saves a
    # forward pass); True recomputes them with the trainer, as verl does.
    recompute_old_logprobs: bool = False


@dataclass
class ActorConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    warmup_steps: int = 0
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    min_lr_ratio: float = 0.0
    mini_batch_size: int = 0  # rows per optimizer step; 0 = the whole step's batch
    micro_batch_size: int = 32  # rows per forward/backward (gradient accumulation)
    epochs: int = 1  # passes over each rollout batch
    grad_clip: float = 1.0
    bf16: bool = False  # bf16 autocast for forward/backward


@dataclass
class PlacementConfig:
    backend: Literal["local", "ray"] = "local"
    world_size: int = 1  # size of the "main" pool: data-parallel actor ranks
    # Extra pools (name -> workers) and a role -> pool map. Roles default to "main"; the
    # actor and the rollout engine must share a pool (the engine reads the actor's weights
    # in place). E.g. pools={aux: 1}, roles={reward: aux, reference: aux} puts scoring on
    # its own workers, where it runs concurrently with the other scoring calls.
    pools: dict[str, int] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    cpus_per_worker: int = 1
    gpus_per_worker: int = 0
    threads_per_worker: int = 0  # torch threads in each worker; 0 = leave torch's default


@dataclass
class TrainerConfig:
    steps: int = 100
    run_dir: str = "runs/grpo"
    seed: int = 0
    eval_every: int = 0  # steps between held-out evaluations (0 = start and end only)
    save_every: int = 0  # steps between checkpoints (0 = only at the end)
    resume: str = ""  # "" = fresh, "auto" = latest checkpoint in run_dir, or a checkpoint path
    sinks: list[str] = field(default_factory=list)  # extra metric sinks: tensorboard, wandb
    progress: bool = True
    check_weight_sync: bool = False  # assert engine/trainer logprob parity after each sync


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
        rows = self.data.prompts_per_step * self.rollout.n
        mini = self.actor.mini_batch_size or rows
        ws = self.placement.world_size
        if rows % mini:
            raise ValueError(f"actor.mini_batch_size={mini} must divide the step's {rows} rows "
                             f"(data.prompts_per_step x rollout.n)")
        p = self.placement
        unknown = sorted(set(p.roles) - {"actor", "rollout", "reward", "reference"})
        if unknown:
            raise ValueError(f"placement.roles: unknown role(s) {unknown}; roles are actor, rollout, reward, reference")
        if p.roles.get("actor", "main") != p.roles.get("rollout", "main"):
            raise ValueError("placement.roles: actor and rollout must share a pool (the engine reads the "
                             "actor's weights in place)")
        bad = sorted({v for v in p.roles.values() if v != "main" and v not in p.pools})
        if bad:
            raise ValueError(f"placement.roles refers to undefined pool(s) {bad}; define them in placement.pools")
        if mini % ws or self.data.prompts_per_step % ws:
            raise ValueError(f"placement.world_size={ws} must divide actor.mini_batch_size={mini} "
                             f"and data.prompts_per_step={self.data.prompts_per_step}")
