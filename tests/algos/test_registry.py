"""Registries: lookup by name, helpful unknown-name errors, no silent overwrite."""

import pytest

from baton.algos import ADVANTAGES, KL_ESTIMATORS, LOSS_AGG, POLICY_LOSSES, Registry


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
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"} <= set(ADVANTAGES)
    assert {"ppo_clip", "vanilla"} <= set(POLICY_LOSSES)
    assert {"k1", "k2", "k3"} <= set(KL_ESTIMATORS)
    assert {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"} <= set(LOSS_AGG)
