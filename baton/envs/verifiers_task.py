"""A verifiers taskset as a baton task (`data.task: verifiers`; the extra
`pip install -e '.[verifiers]'`, imported only by a run that chooses the task).

    data:
      task: verifiers
      task_args:
        taskset: my_taskset        # an installed taskset id, or an importable module exporting
                                   # its Taskset subclass in __all__ (verifiers' own loader)
        taskset_args: {}           # fields of the taskset's config
        size: 10000                # at most this many tasks are read

verifiers 0.4 (its `verifiers.v1` stack) splits an environment into a taskset (tasks: a prompt,
data, `@vf.reward` functions) and a harness (the agent program that talks to the model). baton
takes the taskset's half: each task is a row (its prompt, as chat messages when it has a system
prompt), and its reward is the task's own scoring (`Task.score` on a trace of the prompt and
the completion: every `@vf.reward`, weighted, as `trace.reward`), registered as
`verifiers/reward`. The verifier (`is_correct`) is that reward >= 1.

A task whose key's crc32 falls in 1 of `heldout_every` is held out (never trained on). A row
carries the taskset's id, its arguments, size and the task's index, so a reward worker or a Ray
worker loads the taskset itself (once per process) and scores without the driver; verifiers'
import (seconds) runs as a reward worker starts (`prepare`), not under a call's deadline.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import random
import threading
import zlib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from baton.envs.base import Row
from baton.rewards.registry import register_reward
from baton.user_modules import require_extra

NAME = "verifiers"


def _vf() -> Any:
    return require_extra("verifiers.v1", "verifiers", f"data.task={NAME}")


def taskset_class(taskset: str) -> type:
    """The Taskset class `taskset` names: an installed taskset id (verifiers' own loader), or
    a dotted module path (`recipes.envs.vf_sums`, imported here: verifiers' loader takes
    top-level names only) whose `__all__` exports one Taskset subclass."""
    vf = _vf()
    from verifiers.v1.utils import loaders

    if "." not in taskset:
        return loaders.taskset_class(taskset)
    return loaders._plugin_class(importlib.import_module(taskset), vf.Taskset, "taskset")


@lru_cache(maxsize=8)
def load_tasks(taskset: str, args_json: str, size: int) -> list[Any]:
    """The first `size` tasks of taskset `taskset` built with config fields `args_json`."""
    vf = _vf()
    from verifiers.v1.utils.generic import concrete_type

    from baton.user_modules import own_error

    try:
        cls = taskset_class(taskset)
    except ModuleNotFoundError as e:
        if e.name and taskset.startswith(e.name):  # the taskset itself is not there
            raise ValueError(f"data.task_args.taskset={taskset!r}: {e}") from None
        raise ValueError(f"data.task_args.taskset={taskset!r}: importing it failed: {own_error(e)}") from None
    except Exception as e:  # noqa: BLE001 - its module raising at import, a syntax error, no Taskset in it
        raise ValueError(f"data.task_args.taskset={taskset!r}: importing it failed: {own_error(e)}") from None
    try:
        config = (concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig)(
            id=taskset, **json.loads(args_json))
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError: a field the config does not have
        raise ValueError(f"data.task_args.taskset_args for {taskset!r}: {' '.join(str(e).split())[:300]}") from None
    try:
        return list(cls(config).take(size))
    except Exception as e:  # noqa: BLE001 - the taskset's own code, building its tasks
        raise ValueError(f"data.task_args.taskset={taskset!r}: building its tasks failed: {own_error(e)}") from None


def _trace(task: Any, completion: str) -> Any:
    """A verifiers trace of one exchange: the task's prompt, then `completion` as the sampled reply."""
    vf = _vf()
    from verifiers.v1.trace import AgentInfo, TraceTask

    prompt = task.data.prompt
    messages = ([vf.SystemMessage(content=task.data.system_prompt)] if task.data.system_prompt else []) + (
        [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt or []))
    nodes = [vf.MessageNode(parent=i - 1 if i else None, message=m) for i, m in enumerate(messages)]
    nodes.append(vf.MessageNode(parent=len(nodes) - 1 if nodes else None,
                                message=vf.AssistantMessage(content=completion), sampled=True))
    return vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key),
                    agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes, is_completed=True, ok=True)


_LOOPS = threading.local()


def _loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop for scoring, made once (not one per call, as asyncio.run does)."""
    loop = getattr(_LOOPS, "loop", None)
    if loop is None:
        loop = _LOOPS.loop = asyncio.new_event_loop()
    return loop


def task_reward(task: Any, completion: str) -> float:
    """The task's own weighted reward for `completion` (its `@vf.reward` functions)."""
    trace = _trace(task, completion.split("<eos>", 1)[0])
    _loop().run_until_complete(task.score(trace))
    return float(trace.reward)


def _task_of(row: Row) -> Any:
    """The row's task: its taskset loaded once per process (the key holds the run's size)."""
    return load_tasks(row["vf_taskset"], row["vf_args"], int(row["vf_size"]))[int(row["vf_index"])]


@register_reward("verifiers/reward")
def verifiers_reward(prompt: Any, completion: str, **row: Any) -> float:
    """The verifiers task's own reward (its `@vf.reward` functions, weighted)."""
    return task_reward(_task_of(row), completion)


verifiers_reward.prepare = _vf  # verifiers' import (seconds) at a reward worker's start, not in its first call


def _prompt(task: Any) -> Any:
    data = task.data
    if data.system_prompt or not isinstance(data.prompt, str):
        messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        return messages + ([{"role": "user", "content": data.prompt}] if isinstance(data.prompt, str)
                           else [m.model_dump(exclude_none=True) for m in data.prompt or []])
    return data.prompt


@dataclass(frozen=True)
class VerifiersTask:
    """A verifiers taskset as a Task (module docstring)."""
    name: str = NAME
    taskset: str = ""
    taskset_args: dict[str, Any] = field(default_factory=dict)
    size: int = 10_000
    heldout_every: int = 10
    reward_weights: dict[str, float] = field(default_factory=lambda: {"verifiers/reward": 1.0})

    def configure(self, taskset: str = "", taskset_args: dict[str, Any] | None = None, size: int = 10_000,
                  heldout_every: int = 10) -> "VerifiersTask":
        _vf()  # the missing extra is this one line, whatever this process has cached
        if not isinstance(taskset, str) or not taskset:
            raise ValueError(f"data.task={NAME} needs data.task_args.taskset: a verifiers taskset id or module")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 or not isinstance(heldout_every, int) \
                or heldout_every < 2:
            raise ValueError("data.task_args.size must be an int >= 1 and heldout_every an int >= 2")
        task = replace(self, taskset=taskset, taskset_args=dict(taskset_args or {}), size=size,
                       heldout_every=heldout_every)
        if not task._tasks():
            raise ValueError(f"data.task_args.taskset={taskset!r} has no tasks")
        return task

    def _tasks(self) -> list[Any]:
        if not self.taskset:
            raise ValueError(f"data.task={NAME} needs data.task_args.taskset (the registered task only scores)")
        return load_tasks(self.taskset, json.dumps(self.taskset_args, sort_keys=True), self.size)

    def _rows(self, held: bool) -> list[Row]:
        args = json.dumps(self.taskset_args, sort_keys=True)
        return [{"prompt": _prompt(t), "answer": str(getattr(t.data, "answer", "") or ""), "vf_taskset": self.taskset,
                 "vf_args": args, "vf_size": self.size, "vf_index": i}
                for i, t in enumerate(self._tasks())
                if (zlib.crc32(t.key.encode()) % self.heldout_every == 0) == held]

    def train_rows(self, n: int | None = None, seed: int = 0) -> list[Row]:
        rows = self._rows(held=False)
        random.Random(seed).shuffle(rows)
        return rows if n is None else rows[:n]

    def eval_rows(self, n: int = 200) -> list[Row]:
        return self._rows(held=True)[:n]

    def target(self, row: Row) -> str:
        if not row.get("answer"):
            raise ValueError(f"data.task={NAME}: task {row['vf_index']} has no `answer` field for SFT to teach")
        return str(row["answer"])

    def is_correct(self, completion: str, row: Row) -> bool:
        return task_reward(_task_of(row), completion) >= 1.0

    def prepare(self) -> None:
        """verifiers' import (seconds), as evaluation's verifier worker starts (`envs.evaluate.Verdict`)."""
        _vf()
