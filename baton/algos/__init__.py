"""RL algorithm primitives: pure torch functions, variants chosen from registries.

Shape legend (used in every shape comment of the package):
    B  rows = prompts x samples (one row per sampled response)
    G  samples per prompt (group size); rows of a group share `group_index`
    R  response length (right-padded; `response_mask` [B, R] marks real tokens)
    V  vocabulary size
    P  prompt length, T = P + R (see `baton.fields`)

Registries (name -> function; add a variant with the matching `register_*` decorator):
    ADVANTAGES      grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, gae
    POLICY_LOSSES   ppo_clip, vanilla
    KL_ESTIMATORS   k1, k2, k3
    LOSS_AGG        token-mean, seq-mean-token-mean, seq-mean-token-sum-norm
This package imports only torch and the standard library.
"""

from baton.algos.advantages import (
    ADVANTAGE_INPUTS, ADVANTAGES, compute_advantages, discounted_returns, dr_grpo_advantages,
    gae_advantages, grpo_advantages, group_inverse, group_stats, register_advantage,
    reinforce_pp_advantages, reinforce_pp_baseline_advantages, rloo_advantages,
)
from baton.algos.aggregate import LOSS_AGG, aggregate_loss, loss_normalisers, register_loss_agg
from baton.algos.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3, kl_penalty, register_kl
from baton.algos.logprobs import entropy_from_logits, logprobs_from_logits
from baton.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten
from baton.algos.objective import actor_loss
from baton.algos.policy_loss import (
    POLICY_LOSSES, ppo_clip_loss, register_policy_loss, value_loss, vanilla_pg_loss,
)
from baton.algos.registry import Registry

__all__ = [
    "ADVANTAGE_INPUTS", "ADVANTAGES", "KL_ESTIMATORS", "LOSS_AGG", "POLICY_LOSSES", "Registry",
    "actor_loss", "aggregate_loss", "compute_advantages", "discounted_returns",
    "dr_grpo_advantages", "entropy_from_logits", "gae_advantages", "grpo_advantages",
    "group_inverse", "group_stats", "kl_k1", "kl_k2", "kl_k3", "kl_penalty", "logprobs_from_logits",
    "loss_normalisers", "masked_mean", "masked_sum", "masked_var", "masked_whiten",
    "ppo_clip_loss", "register_advantage", "register_kl", "register_loss_agg",
    "register_policy_loss", "reinforce_pp_advantages", "reinforce_pp_baseline_advantages",
    "rloo_advantages", "value_loss", "vanilla_pg_loss",
]
