"""Tasks (prompt sources + verifiers + reward functions) and held-out evaluation.

Importing this package registers the built-in tasks in `TASKS` (arithmetic, gsm8k,
reasoning_gym, verifiers), their reward functions in `baton.rewards.runner.REWARD_FUNCTIONS`, and the
environments that serve
them to the trajectory API in `ENVIRONMENTS` (`environment.py`: the protocol and
`TaskEnvironment`).
"""

from baton.envs.arithmetic import ArithmeticTask, correctness, format_reward, verify
from baton.envs.chat_arithmetic import ChatArithmeticTask
from baton.envs.base import TASKS, Task, configured_task, get_task, register_task, row_kwargs
from baton.envs.environment import (ENVIRONMENTS, Environment, ScoredGroup, TaskEnvironment, make_environment,
                                    register_environment)
from baton.envs.gsm8k import GSM8KTask
from baton.envs.reasoning_gym_task import ReasoningGymTask
from baton.envs.verifiers_task import VerifiersTask

register_task(ArithmeticTask())
register_task(ChatArithmeticTask())  # arithmetic asked in words through a chat template (SmolLM2)
register_task(GSM8KTask())  # reads its rows from data.path (a GSM8K jsonl or verl parquet)
register_task(ReasoningGymTask())  # data.task_args.datasets; the reasoning-gym extra, imported when used
register_task(VerifiersTask())  # data.task_args.taskset; the verifiers extra, imported when used

__all__ = ["ArithmeticTask", "ChatArithmeticTask", "ENVIRONMENTS", "Environment", "GSM8KTask", "ReasoningGymTask", "ScoredGroup", "TASKS",
           "Task", "TaskEnvironment", "VerifiersTask", "configured_task", "correctness", "format_reward", "get_task",
           "make_environment",
           "register_environment", "register_task", "row_kwargs", "verify"]

import baton.envs.agent_tasks  # noqa: E402, F401 - registers the agent recipe's tasks (multiply, calc_format)
