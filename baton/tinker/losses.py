"""Tinker's built-in losses (`forward_backward(data, loss_fn=...)`), computed by baton's own loss code.

Each loss takes one datum's target logprobs [T] (with their graph), its `loss_fn_inputs` as
float tensors [T] and the request's `loss_fn_config`, and returns the per-token loss [T].
Tinker's losses are sums over tokens (and datums), not means; the server sums what these
return. The policy-gradient ones are baton's `POLICY_LOSSES` on the row [1, T] with every
position real (Tinker's padding carries advantage 0, so it adds nothing):

    cross_entropy        -weights * logp                               inputs: target_tokens, weights
    importance_sampling  baton `vanilla`: -exp(logp - q) * A            inputs: target_tokens, logprobs, advantages
    ppo                  baton `ppo_clip` with clip_low = 1 - clip_low_threshold,
                         clip_high = clip_high_threshold - 1 (thresholds 0.8 / 1.2 by default)

Every other name (`cispo`, `dro`, `gspo`, `stable_reinforce`, ...) is refused by the server
with a one-line 400 naming it (`LOSSES` is the registry: a new loss is one entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from baton.algos.policy_loss import POLICY_LOSSES
from baton.registry import Registry

LossFn = Callable[[torch.Tensor, dict[str, torch.Tensor], dict[str, float]], torch.Tensor]


@dataclass(frozen=True)
class TinkerLoss:
    fn: LossFn
    inputs: tuple[str, ...]  # the loss_fn_inputs it needs besides target_tokens
    config: dict[str, float] = field(default_factory=dict)  # loss_fn_config keys it reads, with defaults


LOSSES = Registry("Tinker loss")


def _policy(name: str, logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], **kwargs) -> torch.Tensor:
    row = logprobs.unsqueeze(0)  # [1, T]
    per_token, _ = POLICY_LOSSES[name](logprobs=row, old_logprobs=inputs["logprobs"].unsqueeze(0),
                                       advantages=inputs["advantages"].unsqueeze(0),
                                       response_mask=torch.ones_like(row), **kwargs)
    return per_token[0]  # [T]


def _cross_entropy(logprobs, inputs, config):
    return -logprobs * inputs["weights"]


def _importance_sampling(logprobs, inputs, config):
    return _policy("vanilla", logprobs, inputs)


def _ppo(logprobs, inputs, config):
    return _policy("ppo_clip", logprobs, inputs, clip_low=1.0 - config["clip_low_threshold"],
                   clip_high=config["clip_high_threshold"] - 1.0)


LOSSES.add("cross_entropy", TinkerLoss(_cross_entropy, ("weights",)))
LOSSES.add("importance_sampling", TinkerLoss(_importance_sampling, ("logprobs", "advantages")))
LOSSES.add("ppo", TinkerLoss(_ppo, ("logprobs", "advantages"),
                             {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}))


def loss_config(name: str, given: dict[str, float | str]) -> dict[str, float]:
    """The loss's config with the request's values; ValueError for a key it does not read."""
    spec: TinkerLoss = LOSSES[name]
    unknown = sorted(set(given) - set(spec.config))
    if unknown:
        raise ValueError(f"loss_fn_config key {unknown[0]!r} is not read by loss_fn {name!r} "
                         f"(it reads: {', '.join(spec.config) or 'nothing'})")
    out = dict(spec.config)
    for k, v in given.items():
        if isinstance(v, str):
            raise ValueError(f"loss_fn_config[{k!r}] must be a number, got {v!r}")
        out[k] = float(v)
    if name == "ppo" and not out["clip_low_threshold"] <= 1.0 <= out["clip_high_threshold"]:
        raise ValueError("ppo needs clip_low_threshold <= 1 <= clip_high_threshold")
    return out
