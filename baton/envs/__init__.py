"""Tasks (prompt sources + verifiers + reward functions) and held-out evaluation.

Importing this package registers the built-in tasks in `TASKS` and their reward
functions in `baton.rewards.runner.REWARD_FUNCTIONS`.
"""

from baton.envs.arithmetic import ArithmeticTask, correctness, format_reward, verify
from baton.envs.base import TASKS, Task, get_task, register_task, row_kwargs

register_task(ArithmeticTask())

__all__ = ["ArithmeticTask", "TASKS", "Task", "correctness", "format_reward", "get_task",
           "register_task", "row_kwargs", "verify"]
