"""Registries: lookup by name, helpful unknown-name errors, no silent overwrite."""

import pytest

from baton.algos import ADVANTAGES, DPO_LOSSES, KL_CONTROLLERS, KL_ESTIMATORS, LOSS_AGG, PAIRINGS, \
    POLICY_LOSSES, Registry


def test_registry_register_lookup_and_errors():
    reg = Registry("thing")

    @reg.register("a")
    def a():
        return 1

    assert reg["a"] is a and a() == 1
    with pytest.raises(KeyError, match=r"unknown thing 'b'; known: \['a'\]"):
        reg["b"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
    assert reg["a"] is a


def test_builtin_names():
    assert {"grpo", "dr_grpo", "rloo", "remax", "reinforce_pp", "reinforce_pp_baseline",
            "gae"} <= set(ADVANTAGES)
    assert {"ppo_clip", "vanilla", "gspo"} <= set(POLICY_LOSSES)
    assert {"k1", "k2", "k3", "abs"} <= set(KL_ESTIMATORS)
    assert {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
            "seq-mean-token-sum-norm"} <= set(LOSS_AGG)
    assert {"fixed", "adaptive"} <= set(KL_CONTROLLERS)
    assert {"best_worst", "all"} <= set(PAIRINGS)
    assert {"sigmoid", "ipo", "hinge"} <= set(DPO_LOSSES)
