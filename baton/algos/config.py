"""The `algo:` section of a recipe: which estimator and which objective, by registry name.

The driver reads `advantage`; the actor reads the rest (its loss). Names are checked
against the registries when the run config is validated (see `check_algo_names`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from baton.algos.advantages import ADVANTAGES
from baton.algos.aggregate import LOSS_AGG
from baton.algos.kl import KL_ESTIMATORS
from baton.algos.policy_loss import POLICY_LOSSES


@dataclass
class AlgoConfig:
    advantage: str = "grpo"  # a name in baton.algos.ADVANTAGES ("grpo", "dr_grpo", "rloo", ...)
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


# Inputs an advantage estimator may need beyond the rewards, and the role that makes them.
NEEDS_ROLE = {"values": "a critic", "baseline_scores": "greedy rollouts (ReMax)"}


def check_algo_names(algo: AlgoConfig) -> None:
    """Raise ValueError naming the key and the valid choices for any unknown name."""
    for key, registry in (("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES),
                          ("kl_estimator", KL_ESTIMATORS), ("loss_agg", LOSS_AGG)):
        name = getattr(algo, key)
        if name not in registry:
            raise ValueError(f"algo.{key}={name!r} is not one of {sorted(registry)}")


def check_advantage_inputs(name: str, available: set[str]) -> None:
    """Raise ValueError if estimator `name` needs an input the trainer does not produce
    (e.g. `gae` needs values, which only a critic makes)."""
    def required(n: str) -> set[str]:
        params = inspect.signature(ADVANTAGES[n]).parameters.values()
        return {p.name for p in params if p.default is inspect.Parameter.empty}

    missing = required(name) - available
    if missing:
        makers = ", ".join(f"{m} from {NEEDS_ROLE.get(m, 'an input this trainer lacks')}" for m in sorted(missing))
        usable = sorted(n for n in ADVANTAGES if required(n) <= available)
        raise ValueError(f"algo.advantage={name!r} needs {makers}, which this trainer does not run; "
                         f"usable here: {usable}")
