"""KL coefficient controllers for the KL-in-reward penalty (PPO with a critic), by name from
`KL_CONTROLLERS`: "fixed" and "adaptive".

Adaptive (Ziegler et al. 2019, "Fine-tuning language models from human preferences", eq. 2):
    e = clip(current_kl / target_kl - 1, -0.2, 0.2)
    beta <- beta * (1 + e * n_steps / horizon)
so beta grows while the policy's KL is above the target and shrinks below it, by at most
20% x n_steps / horizon per update. n_steps is the number of samples the KL was measured on
(verl and TRL pass the batch size). `current_kl` must be measured the way `target_kl` is meant
(`kl_in_reward` returns a per-token mean; see its docstring).

Both keep their state in `value` (a Python float), and `state_dict()` / `load_state_dict()`
round-trip it exactly, so a resumed run continues with the same beta bit for bit. The
hyper-parameters are configuration, not state: they are not saved.
Departure from verl: horizon and target_kl are checked to be > 0 (verl only checks horizon).
"""

from __future__ import annotations

from typing import Any, Callable

from baton.algos.registry import Registry, hyper_args

KL_CONTROLLERS = Registry("KL controller")
KL_CONTROLLER_HYPER: dict[str, dict[str, str]] = {}  # name -> {keyword: "algo.<key>" it is given}


def register_kl_controller(name: str, hyper: dict[str, str] | None = None) -> Callable[[Any], Any]:
    """Decorator: a controller class by `name`, with the `algo.*` keys its constructor takes
    (`hyper`: keyword -> key), as estimators and losses declare theirs."""
    def deco(cls: Any) -> Any:
        KL_CONTROLLERS.add(name, cls)
        KL_CONTROLLER_HYPER[name] = dict(hyper or {})
        return cls
    return deco


def build_kl_controller(algo: Any) -> Any:
    """`algo.kl_controller`'s controller, given the keys it declares."""
    return KL_CONTROLLERS[algo.kl_controller](**hyper_args(KL_CONTROLLER_HYPER[algo.kl_controller], algo))

PROPORTIONAL_CLIP = 0.2  # Ziegler et al.'s bound on the relative error per update


class _Controller:
    value: float

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


@register_kl_controller("fixed", hyper={"kl_coef": "kl_reward_coef"})
class FixedKLController(_Controller):
    """beta stays `kl_coef`; `update` is a no-op (same interface as the adaptive one)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


@register_kl_controller("adaptive", hyper={"kl_coef": "kl_reward_coef", "target_kl": "kl_target",
                                           "horizon": "kl_horizon"})
class AdaptiveKLController(_Controller):
    """beta adapted towards `target_kl` over `horizon` samples (see the module docstring)."""

    def __init__(self, kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"target_kl and horizon must be > 0, got {target_kl}, {horizon}")
        self.value = float(kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target_kl - 1.0, -PROPORTIONAL_CLIP),
                    PROPORTIONAL_CLIP)
        self.value *= 1.0 + error * n_steps / self.horizon
