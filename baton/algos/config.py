"""The `algo:` section of a recipe: which estimator and which objective, by registry name.

The driver reads `advantage` and the data-side options (KL in the reward and its controller,
GAE's gamma / lambda, truncated IS, DAPO's dynamic sampling and overlong penalty); the actor
reads the rest (its loss). Names are checked against the registries and values against
their ranges when the run config is validated (`check_algo_names`, `check_algo_ranges`).
The data-side options are read by the PPO-family driver (`baton.trainers.ppo`); online DPO
reads none of them (its config refuses them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from baton.algos.advantages import ADVANTAGES, NEEDS, estimator_needs
from baton.algos.aggregate import LOSS_AGG
from baton.algos.distill import DISTILL_LOSSES
from baton.algos.kl import KL_ESTIMATORS
from baton.algos.kl_control import KL_CONTROLLER_HYPER, KL_CONTROLLERS
from baton.algos.off_policy import OFF_POLICY, OFF_POLICY_NEEDS
from baton.algos.policy_loss import POLICY_LOSS_HYPER, POLICY_LOSSES
from baton.algos.registry import key_readers


@dataclass
class AlgoConfig:
    advantage: str = ""  # a name in baton.algos.ADVANTAGES ("grpo", "gae", "rloo", ...); "" = the algorithm's
    policy_loss: str = "ppo_clip"  # a name in baton.algos.POLICY_LOSSES
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO clip-higher
    dual_clip: float | None = None  # e.g. 3.0: caps the loss of negative-advantage tokens
    kl_coef: float = 0.0  # > 0 adds KL(policy || reference) as a loss term and loads a reference
    kl_estimator: str = "k3"  # a name in baton.algos.KL_ESTIMATORS
    entropy_coef: float = 0.0
    loss_agg: str = "token-mean"  # a name in baton.algos.LOSS_AGG
    # Use the engine's behaviour logprobs as the PPO "old" logprobs (exact in fp32, saves a
    # forward pass); True recomputes them with the trainer, as verl does.
    recompute_old_logprobs: bool = False
    # --- data side, read by the PPO-family driver --------------------------------------
    # KL to the reference folded into the token rewards (InstructGPT) instead of the loss:
    # r_t -= beta * KL_t, beta from a controller in baton.algos.KL_CONTROLLERS.
    kl_in_reward: bool = False
    kl_reward_coef: float = 0.001  # the initial beta
    kl_reward_estimator: str = "k1"  # a name in baton.algos.KL_ESTIMATORS
    kl_controller: str = "fixed"  # "fixed" | "adaptive"
    kl_target: float = 0.01  # adaptive: the per-token KL aimed at
    kl_horizon: int = 10_000  # adaptive: samples over which beta closes the gap
    gamma: float = 1.0  # GAE / return discount
    lam: float = 1.0  # GAE lambda
    whiten_advantages: bool = True  # GAE: whiten over the batch (returns never are)
    # distill: the weight of the task reward (group-centred, on every token) added to the
    # teacher's per-token reverse KL; 0 = the teacher alone (no reward is needed)
    task_reward_coef: float = 0.0
    # distill: "advantage" = the sampled token's log p_teacher - log p_student as the advantage;
    # a name in baton.algos.distill.DISTILL_LOSSES ("reverse_kl", "forward_kl", "jsd") = that
    # divergence over the teacher's top-k tokens at each position as a loss term (GKD)
    distill_loss: str = "advantage"
    distill_topk: int = 0  # the teacher's tokens kept per position; 0 = the whole vocabulary
    distill_beta: float = 0.5  # jsd: the teacher's weight in the mixture, in (0, 1)
    # DAPO dynamic sampling: drop prompt groups whose rewards are all equal and sample more
    # prompts, at most `dynamic_sampling_max_rounds` extra rounds, until the batch is full.
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = 3
    # DAPO soft overlong penalty over the last `overlong_buffer` tokens before
    # max_new_tokens (0 = off), down to -overlong_penalty at the limit.
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    # --- off-policy rows (asynchronous training, train/inference mismatch) ---------------
    # A name in baton.algos.OFF_POLICY: "none" | "tis" | "decoupled_ppo". tis / decoupled_ppo
    # recompute the proximal (old) logprobs with the trainer and weigh each token's policy
    # loss by pi_prox / mu: truncated at the cap (tis, Yao et al. 2025's TIS against the
    # engine) or dropped above it (decoupled_ppo). With recompute_old_logprobs and "none",
    # the mismatch is measured (off_policy/mismatch_kl) but not corrected.
    off_policy: str = "none"
    off_policy_cap: float = 2.0


def check_algo_names(algo: AlgoConfig) -> None:
    """Raise ValueError naming the key and the valid choices for any unknown name."""
    for key, registry in (("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES),
                          ("kl_estimator", KL_ESTIMATORS), ("loss_agg", LOSS_AGG),
                          ("kl_reward_estimator", KL_ESTIMATORS), ("kl_controller", KL_CONTROLLERS),
                          ("off_policy", OFF_POLICY), ("distill_loss", DISTILL_LOSSES)):
        name = getattr(algo, key)
        if name not in registry:
            raise ValueError(f"algo.{key}={name!r} is not one of {sorted(registry)}")


def check_algo_ranges(algo: AlgoConfig) -> None:
    """Raise ValueError naming the key for any value out of its range."""
    a = algo
    checks = [
        (a.kl_coef >= 0 and a.entropy_coef >= 0,
         f"algo.kl_coef and algo.entropy_coef must be >= 0 (got {a.kl_coef}, {a.entropy_coef})"),
        (0 <= a.clip_low < 1 and a.clip_high >= 0,
         f"algo.clip_low must be in [0, 1) and algo.clip_high >= 0 (got {a.clip_low}, {a.clip_high})"),
        (a.dual_clip is None or a.dual_clip > 1, f"algo.dual_clip must be > 1 or null, got {a.dual_clip}"),
        (a.kl_reward_coef >= 0, f"algo.kl_reward_coef must be >= 0, got {a.kl_reward_coef}"),
        (a.kl_target > 0 and a.kl_horizon > 0,
         f"algo.kl_target and algo.kl_horizon must be > 0 (got {a.kl_target}, {a.kl_horizon})"),
        (0 <= a.gamma <= 1 and 0 <= a.lam <= 1, f"algo.gamma and algo.lam must be in [0, 1] (got {a.gamma}, {a.lam})"),
        (a.task_reward_coef >= 0, f"algo.task_reward_coef must be >= 0, got {a.task_reward_coef}"),
        (a.distill_topk >= 0, f"algo.distill_topk must be >= 0 (0: the whole vocabulary), got {a.distill_topk}"),
        (0 < a.distill_beta < 1, f"algo.distill_beta must be in (0, 1), got {a.distill_beta}"),
        (a.off_policy_cap >= 1, f"algo.off_policy_cap must be >= 1, got {a.off_policy_cap}"),
        (a.dynamic_sampling_max_rounds >= 0,
         f"algo.dynamic_sampling_max_rounds must be >= 0, got {a.dynamic_sampling_max_rounds}"),
        (a.overlong_buffer >= 0 and a.overlong_penalty >= 0,
         f"algo.overlong_buffer and algo.overlong_penalty must be >= 0 (got {a.overlong_buffer}, {a.overlong_penalty})"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


# Keys read only when another key switches them on: (key, read when, "the switch" for the message).
SWITCHED_KEYS = (
    ("kl_estimator", lambda a: a.kl_coef > 0, "algo.kl_coef > 0"),
    ("kl_reward_coef", lambda a: a.kl_in_reward, "algo.kl_in_reward=true"),
    ("kl_reward_estimator", lambda a: a.kl_in_reward, "algo.kl_in_reward=true"),
    ("kl_controller", lambda a: a.kl_in_reward, "algo.kl_in_reward=true"),
    ("dynamic_sampling_max_rounds", lambda a: a.dynamic_sampling, "algo.dynamic_sampling=true"),
    ("overlong_penalty", lambda a: a.overlong_buffer > 0, "algo.overlong_buffer > 0"),
)


def declared_keys() -> dict[str, dict[str, list[str]]]:
    """`algo.<selector>` -> {entry name -> the `algo.*` keys it declares it reads}, for every
    registry whose entries declare their keys (estimators, policy losses, distillation
    losses, KL controllers, off-policy corrections)."""
    return {"advantage": {n: list(NEEDS[n].hyper.values()) for n in NEEDS},
            "policy_loss": {n: list(h.values()) for n, h in POLICY_LOSS_HYPER.items()},
            "distill_loss": {n: list(form.keys) for n, form in DISTILL_LOSSES.items()},
            "kl_controller": {n: list(h.values()) for n, h in KL_CONTROLLER_HYPER.items()},
            "off_policy": {n: list(needs.hyper.values()) for n, needs in OFF_POLICY_NEEDS.items()}}


GATES = {"kl_controller": lambda a: a.kl_in_reward}  # a selector read only when another key switches it on


def dependent_keys() -> list[tuple[str, Callable[[Any], bool], str]]:
    """SWITCHED_KEYS, and (key, read when, switch) for every key some but not all entries of
    a registry declare (`declared_keys`): read when `algo.<selector>` names one that does."""
    out = list(SWITCHED_KEYS)
    for selector, declared in declared_keys().items():
        gate = GATES.get(selector, lambda a: True)
        for key in dict.fromkeys(k for keys in declared.values() for k in keys):
            readers = key_readers(declared, key)
            if len(readers) < len(declared):
                out.append((key, lambda a, s=selector, r=tuple(readers), g=gate: g(a) and getattr(a, s) in r,
                            f"algo.{selector}={'/'.join(readers)}"))
    return out


def check_algo_dependencies(algo: AlgoConfig) -> None:
    """Raise ValueError for a key set to a non-default value that nothing would read, because
    the key that switches it on is off (e.g. algo.gamma=0.9 with algo.advantage=grpo)."""
    defaults = AlgoConfig()
    for key, read, switch in dependent_keys():
        value = getattr(algo, key)
        if value != getattr(defaults, key) and not read(algo):
            raise ValueError(f"algo.{key}={value} is read only with {switch}, which this run does not set "
                             f"(algo.advantage={algo.advantage!r}): remove it or switch it on")


def check_advantage_needs(name: str, critic: bool, teacher: bool = False) -> None:
    """Raise ValueError if estimator `name` reads values and the run has no critic, or the
    run has a critic that `name` does not read; likewise for a teacher (its declared needs,
    `EstimatorNeeds`)."""
    needs = estimator_needs(name)
    if needs.teacher and not teacher:
        raise ValueError(f"algo.advantage={name!r} learns from a teacher's logprobs: give a teacher: section "
                         f"(teacher.path: a local HF model with the student's tokenizer)")
    if teacher and not needs.teacher:
        teachers = sorted(n for n in ADVANTAGES if estimator_needs(n).teacher)
        raise ValueError(f"teacher: section (teacher.path) given but algo.advantage={name!r} does not read a teacher's logprobs; "
                         f"use algo.advantage in {teachers} or drop the teacher section")
    if needs.critic and not critic:
        usable = sorted(n for n in ADVANTAGES if not estimator_needs(n).critic)
        raise ValueError(f"algo.advantage={name!r} needs values from a critic, which this trainer does not run; "
                         f"usable here: {usable}")
    if critic and not needs.critic:
        raise ValueError(f"critic: section given but algo.advantage={name!r} does not use values; "
                         f"use algo.advantage=gae or drop the critic section")
