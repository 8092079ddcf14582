"""Per-token estimators of KL(policy || reference), chosen by name from `KL_ESTIMATORS`.

With d = logp - ref_logp on tokens sampled from the policy (Schulman, "Approximating KL
divergence", 2020):
    k1 = d                          unbiased, high variance, can be negative
    k2 = 0.5 d^2                    biased, low variance, >= 0
    k3 = exp(-d) - (-d) - 1         unbiased, low variance, >= 0
    abs = |d|                       biased upwards (E|d| >= E d = KL), >= 0 (verl's "abs")
As a *loss term* (coefficient * aggregated estimate), what matters is the gradient, and
they differ (Liu et al., "On a few pitfalls in KL divergence gradient estimation", 2025):
  * k1: expected gradient is 0 (E_pi[grad log pi] = 0) - use k1 as a reward penalty instead;
  * k2: expected gradient is exactly grad KL(pi || ref), the reverse KL;
  * k3: expected gradient is grad KL(ref || pi), the *forward* KL (GRPO's choice).
tests/algos/test_kl.py checks these three claims exactly on a small categorical.

Departure: k3 clamps -d to [-20, 20] before exp so that one token that the reference finds
impossible cannot overflow the loss (verl clamps the result to +-10 instead).
"""

from __future__ import annotations

import torch

from baton.algos.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")
register_kl = KL_ESTIMATORS.register

LOG_RATIO_CLAMP = 20.0


@register_kl("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs  # [B, R]


@register_kl("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2  # [B, R]


@register_kl("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    neg_d = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, R]
    return torch.exp(neg_d) - neg_d - 1  # [B, R]


@register_kl("abs")
def kl_abs(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """|logp - ref_logp|: the k1 magnitude, so a reward penalty cannot turn into a bonus."""
    return (logprobs - ref_logprobs).abs()  # [B, R]


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
               estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate [B, R] by estimator name (padding is left to the aggregation)."""
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)
