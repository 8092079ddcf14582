"""Reward functions for the fault tests, in a module of their own with no heavy imports:
the reward worker processes import the module that defines a function, so a test module
that imports torch and the trainer would make every worker start slowly."""

from baton.rewards.registry import REWARD_FUNCTIONS, register_reward


def nan_reward(prompt, completion, **row):
    return float("nan")


if "test/nan" not in REWARD_FUNCTIONS:
    register_reward("test/nan")(nan_reward)


def always_raises(prompt, completion, **row):
    raise ValueError("this reward function is broken")


if "test/always_raises" not in REWARD_FUNCTIONS:
    register_reward("test/always_raises")(always_raises)
