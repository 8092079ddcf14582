"""The reward-function registry: name -> `reward(prompt, completion, **row) -> float`.

Tasks register their functions here when imported (`baton.envs`); recipes name them
(`reward.functions: {"arithmetic/correct": 1.0}`). Kept apart from the runner so the worker
processes' entry point (`serve.py`) can look names up without importing the runner.
A name is registered once (`baton.registry.Registry` refuses overwrites).
"""

from __future__ import annotations

from typing import Callable

from baton.registry import Registry

RewardFn = Callable[..., float]
REWARD_FUNCTIONS: Registry = Registry("reward function")


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    return REWARD_FUNCTIONS.register(name)
