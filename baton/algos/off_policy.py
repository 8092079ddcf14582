"""Off-policy corrections for rows sampled by an older policy (asynchronous training) or by
an engine whose numerics differ from the trainer's: chosen by name from `OFF_POLICY`
(`algo.off_policy`: none | tis | decoupled_ppo).

Three policies meet in a step: mu, the behaviour policy that sampled the rows (the engine,
possibly `trainer.max_staleness` versions old: `rollout_logprobs`); pi_prox, the trainer's
policy at the start of the step (recomputed by the actor: `old_logprobs`); pi_theta, the
policy being optimised. Every correction here keeps the PPO clip against pi_prox (the ratio
pi_theta / pi_prox) and weighs each token's policy loss by a detached, non-negative
w_t(pi_prox / mu):

    none           w = 1 (and nothing is recomputed unless `algo.recompute_old_logprobs`)
    tis            w = min(pi_prox / mu, cap)            truncated IS (Ionides 2008; Yao et
                                                         al. 2025 for the engine mismatch)
    decoupled_ppo  w = pi_prox / mu, tokens with w > cap get w = 0
                   (Hilton et al. 2021, "Batch size-invariance for policy optimization";
                   AReaL's decoupled objective and behaviour-weight cap, Fu et al. 2025)

so the decoupled PPO objective is

    L = -1/N sum_t w_t * min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t),
    r_t = pi_theta(y_t) / pi_prox(y_t)                    (`decoupled_ppo_loss`, per token)

Because w >= 0 and is detached, w * ppo_clip(A) = ppo_clip(w * A) token by token (dual clip
included): the GRPO driver applies the weights by scaling the advantages, which is how the
actor's unchanged loss computes this objective (tested equal).

mu is per token, not per row: `rollout_logprobs[b, t]` is the log-probability of token t
under the weights that sampled it. A row whose tokens span weight versions (an agent's or a
gateway session's turns across a weight update: `token_versions` in `baton.rows`, counted
as `rollout/rows_spanning_versions`) is therefore corrected token by token against the
sampler of each token: nothing here reads the row's single `policy_version` (the oldest,
used only for `rollout/policy_age`). With `none` and no recomputation, PPO's ratio is taken
against these per-token behaviour logprobs themselves (tested:
tests/agents/test_token_versions.py).

Each function takes `proximal_logprobs, behaviour_logprobs, response_mask` ([B, R]) and
`cap`, and returns (weights [B, R] or None, metrics). Metrics (0-d tensors):
    off_policy/mismatch_kl   k3 estimate of KL(mu || pi_prox) on the sampled tokens: the
                             train/inference mismatch plus the policy's age
    off_policy/capped_frac   fraction of real tokens whose ratio pi_prox / mu exceeded the cap
    off_policy/weight_mean   mean weight over real tokens
Departure: log ratios are clamped to +-20 before exp (as in the policy losses).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from baton.algos.masked import masked_mean, masked_sum
from baton.algos.policy_loss import ppo_clip_loss
from baton.algos.registry import Registry

OFF_POLICY = Registry("off-policy correction")


@dataclass(frozen=True)
class OffPolicyNeeds:
    """What a correction reads, declared where it is registered.

    hyper     keyword -> `algo.<key>` it is given (cap -> off_policy_cap)
    proximal  it weighs by pi_prox / mu: the actor recomputes the proximal logprobs (without,
              the "none" correction only measures, when algo.recompute_old_logprobs does)
    """
    hyper: dict[str, str] = field(default_factory=dict)
    proximal: bool = True


OFF_POLICY_NEEDS: dict[str, OffPolicyNeeds] = {}


def register_off_policy(name: str, *, hyper: dict[str, str] | None = None,
                        proximal: bool = True) -> Callable[[Callable], Callable]:
    """Decorator: a correction by `name`, with what it reads (`OffPolicyNeeds`)."""
    def deco(fn: Callable) -> Callable:
        OFF_POLICY.add(name, fn)
        OFF_POLICY_NEEDS[name] = OffPolicyNeeds(dict(hyper or {}), proximal)
        return fn
    return deco


def off_policy_needs(name: str) -> OffPolicyNeeds:
    """The declared needs of correction `name` (UnknownName lists the known ones)."""
    OFF_POLICY[name]  # noqa: B018 -- the registry's own error for an unknown name
    return OFF_POLICY_NEEDS[name]
LOG_RATIO_CLAMP = 20.0


def _ratio(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor):
    mask = mask.bool()  # [B, R]
    log_ratio = torch.where(mask, proximal.float() - behaviour.float(), 0.0)  # [B, R]
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return mask, log_ratio, log_ratio.exp()  # ratio [B, R]: 1 on padding


@torch.no_grad()
def mismatch_kl(proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                response_mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(mu || pi_prox) on the sampled tokens, masked mean (0-d): r - 1 - log r
    with r = pi_prox / mu per token (>= 0, 0 where the two agree). The trainer logs it every
    step as `rollout/logprob_mismatch_kl` (engine vs trainer) whatever `algo.off_policy` is."""
    mask, log_ratio, ratio = _ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    return _k3(mask, log_ratio, ratio)


@torch.no_grad()
def mismatch_kl_sums(proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                     response_mask: torch.Tensor) -> torch.Tensor:
    """[2] float64: `mismatch_kl`'s k3 terms summed over the real tokens, and their count, so
    that pieces (micro-batches, data ranks) add up: mismatch_kl = sums[0] / sums[1]."""
    mask, log_ratio, ratio = _ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    return torch.stack([masked_sum(_k3_terms(log_ratio, ratio), mask).double(), mask.sum().double()])


def _k3_terms(log_ratio, ratio) -> torch.Tensor:
    return ratio - 1 - log_ratio  # [B, R], >= 0


def _k3(mask, log_ratio, ratio) -> torch.Tensor:
    return masked_mean(_k3_terms(log_ratio, ratio), mask)


def _metrics(mask, log_ratio, ratio, weights, cap) -> dict[str, torch.Tensor]:
    return {"off_policy/mismatch_kl": _k3(mask, log_ratio, ratio),
            "off_policy/capped_frac": masked_mean((ratio > cap).float(), mask),
            "off_policy/weight_mean": masked_mean(weights, mask)}


@register_off_policy("none", proximal=False)
@torch.no_grad()
def no_correction(proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                  response_mask: torch.Tensor, cap: float = 2.0):
    """No weights; the metrics still say how far mu is from pi_prox."""
    mask, log_ratio, ratio = _ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    return None, _metrics(mask, log_ratio, ratio, torch.ones_like(ratio), cap)


@register_off_policy("tis", hyper={"cap": "off_policy_cap"})
@torch.no_grad()
def tis_weights(proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                response_mask: torch.Tensor, cap: float = 2.0):
    """w = min(pi_prox / mu, cap): truncated, so a token that mu found far less likely than
    pi_prox cannot dominate; 1 on padding."""
    mask, log_ratio, ratio = _ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    weights = ratio.clamp(max=cap)  # [B, R]
    return weights, _metrics(mask, log_ratio, ratio, weights, cap)


@register_off_policy("decoupled_ppo", hyper={"cap": "off_policy_cap"})
@torch.no_grad()
def decoupled_weights(proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                      response_mask: torch.Tensor, cap: float = 2.0):
    """w = pi_prox / mu, and 0 for tokens whose w exceeds the cap (dropped, not truncated:
    AReaL's behaviour-weight cap); 1 on padding."""
    mask, log_ratio, ratio = _ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    weights = torch.where(ratio > cap, torch.zeros_like(ratio), ratio)  # [B, R]
    return weights, _metrics(mask, log_ratio, ratio, weights, cap)


def decoupled_ppo_loss(*, logprobs: torch.Tensor, proximal_logprobs: torch.Tensor,
                       behaviour_logprobs: torch.Tensor, advantages: torch.Tensor,
                       response_mask: torch.Tensor, clip_low: float = 0.2,
                       clip_high: float | None = None, cap: float = 2.0):
    """The decoupled PPO per-token loss [B, R] (zero on padding) and metrics: the PPO clip
    against pi_prox, weighted by `decoupled_weights` (see the module docstring)."""
    weights, metrics = decoupled_weights(proximal_logprobs, behaviour_logprobs, response_mask, cap)
    loss, clip_metrics = ppo_clip_loss(logprobs=logprobs, old_logprobs=proximal_logprobs,
                                       advantages=advantages, response_mask=response_mask,
                                       clip_low=clip_low, clip_high=clip_high)  # [B, R]
    return loss * weights, {**metrics, **clip_metrics}
