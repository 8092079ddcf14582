"""RL algorithm primitives: pure torch functions, variants chosen from registries.

Shape legend (used in every shape comment of the package):
    B  rows = prompts x samples (one row per sampled response)
    G  samples per prompt (group size); rows of a group share `group_index`
    R  response length (right-padded; `response_mask` [B, R] marks real tokens)
    V  vocabulary size
    P  prompt length, T = P + R (see `baton.fields`); in dpo/pairs, P = number of pairs

Registries (name -> function; add a variant with the matching `register_*` decorator):
    ADVANTAGES      grpo, dr_grpo, rloo, remax, reinforce_pp, reinforce_pp_baseline, gae,
                    turn_grpo (multi-turn: per-turn returns, one weight per trajectory),
                    distill (on-policy distillation: a teacher's per-token reverse KL, discount 0)
                    (`estimator_needs(name)`: what each declares it reads, e.g. values)
    POLICY_LOSSES   ppo_clip, vanilla, gspo
    KL_ESTIMATORS   k1, k2, k3, abs
    LOSS_AGG        token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm
    KL_CONTROLLERS  fixed, adaptive (classes; KL-in-reward coefficient for PPO with a critic)
    OFF_POLICY      none, tis, decoupled_ppo (weights pi_prox / mu for rows of an older policy)
    PAIRINGS        best_worst, all (preference pairs from scored groups)
    DPO_LOSSES      sigmoid, ipo, hinge
Modules without a registry: token_rewards (rewards on tokens, KL in the reward), value
(critic loss, explained variance), dapo (dynamic sampling, overlong penalty).
This package imports only torch, the standard library and `baton.registry`.
"""

from baton.algos.advantages import (
    ADVANTAGE_INPUTS, ADVANTAGES, EstimatorNeeds, compute_advantages, discounted_returns, dr_grpo_advantages,
    estimator_needs, gae_advantages, grpo_advantages, group_inverse, group_stats, register_advantage,
    reinforce_pp_advantages, reinforce_pp_baseline_advantages, remax_advantages, rloo_advantages,
)
from baton.algos.aggregate import LOSS_AGG, aggregate_loss, loss_normalisers, register_loss_agg
from baton.algos.dapo import dynamic_sampling_filter, overlong_penalty
from baton.algos.distill import distill_advantages, distill_metrics
from baton.algos.dpo import (
    DPO_LOSSES, dpo_loss, dpo_sigmoid_loss, hinge_loss, ipo_loss, register_dpo_loss,
    sequence_logprobs,
)
from baton.algos.kl import KL_ESTIMATORS, kl_abs, kl_k1, kl_k2, kl_k3, kl_penalty, register_kl
from baton.algos.kl_control import (
    KL_CONTROLLERS, AdaptiveKLController, FixedKLController, register_kl_controller,
)
from baton.algos.logprobs import entropy_from_logits, logprobs_from_logits
from baton.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten
from baton.algos.objective import actor_loss
from baton.algos.turn_credit import turn_grpo_advantages, turn_segments  # noqa: F401  (registers "turn_grpo")
from baton.algos.off_policy import OFF_POLICY, decoupled_ppo_loss, register_off_policy
from baton.algos.pairs import (
    PAIRINGS, PreferencePairs, all_pairs, best_worst_pairs, preference_pairs, register_pairing,
)
from baton.algos.policy_loss import (
    POLICY_LOSSES, gspo_loss, ppo_clip_loss, register_policy_loss, vanilla_pg_loss,
)
from baton.algos.registry import Registry, UnknownName
from baton.algos.token_rewards import kl_in_reward, token_level_rewards
from baton.algos.value import critic_loss, explained_variance, value_loss

__all__ = [
    "ADVANTAGE_INPUTS", "ADVANTAGES", "EstimatorNeeds", "DPO_LOSSES", "KL_CONTROLLERS", "KL_ESTIMATORS", "LOSS_AGG", "OFF_POLICY",
    "PAIRINGS", "POLICY_LOSSES", "AdaptiveKLController", "FixedKLController", "PreferencePairs",
    "Registry", "UnknownName", "actor_loss", "aggregate_loss", "all_pairs", "best_worst_pairs",
    "compute_advantages", "critic_loss", "decoupled_ppo_loss", "discounted_returns", "distill_advantages",
    "distill_metrics", "dpo_loss", "dpo_sigmoid_loss",
    "dr_grpo_advantages", "dynamic_sampling_filter", "entropy_from_logits", "estimator_needs",
    "explained_variance", "gae_advantages", "grpo_advantages", "group_inverse", "group_stats",
    "gspo_loss", "hinge_loss", "ipo_loss", "kl_abs", "kl_in_reward", "kl_k1", "kl_k2", "kl_k3",
    "kl_penalty", "logprobs_from_logits", "loss_normalisers", "masked_mean", "masked_sum",
    "masked_var", "masked_whiten", "overlong_penalty", "ppo_clip_loss", "preference_pairs",
    "register_advantage", "register_dpo_loss", "register_kl", "register_kl_controller",
    "register_loss_agg", "register_off_policy", "register_pairing", "register_policy_loss", "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages", "remax_advantages",
    "rloo_advantages", "sequence_logprobs", "token_level_rewards",
    "value_loss", "vanilla_pg_loss",
]
