"""What a task is: prompts to train on, held-out prompts to evaluate on, and how to score.

A task hands the trainer plain rows (`{"prompt": str, "answer": str, ...}`): every field
but the prompt reaches the reward functions as keyword arguments, TRL-style:
`reward(prompt, completion, **row) -> float`. Reward functions are registered by name in
`baton.rewards.runner.REWARD_FUNCTIONS` so recipes can weight them
(`reward.functions: {"arithmetic/correct": 1.0}`).

`TASKS` (a `baton.registry.Registry`) maps a task name to a ready instance; `register_task`
adds one. A user's task needs no registration: `data.task: my_tasks:MyTask` (a Task class,
a factory, or an instance in an importable module; the working directory of `baton` is
importable in every process, `baton.user_modules`) is imported and registered under that
name by `get_task` in whichever process asks first (driver, Ray worker, service).

A task that takes arguments (reasoning-gym's datasets, a verifiers environment's id) has
`configure(**data.task_args) -> Task`: the driver builds its rows from the configured task
(`configured_task`); every other process scores with the registered instance, so such a
task's verifier and reward functions read all they need from the row.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from baton.registry import Registry

Row = dict[str, Any]
RewardFn = Callable[..., float]


@runtime_checkable
class Task(Protocol):
    name: str
    # registered reward-function name -> default weight (what a recipe would usually use)
    reward_weights: dict[str, float]

    def train_rows(self, n: int | None = None, seed: int = 0) -> list[Row]:
        """`n` seeded training rows (the task's default size when None); never held-out ones."""
        ...

    def eval_rows(self, n: int = 200) -> list[Row]:
        """The first `n` held-out rows (always the same ones, disjoint from training rows)."""
        ...

    def target(self, row: Row) -> str:
        """The reference completion for supervised training (without EOS)."""
        ...

    def is_correct(self, completion: str, row: Row) -> bool:
        """Exact verifier used by evaluation."""
        ...


TASKS: Registry = Registry("task")  # name -> a ready Task instance


def register_task(task: Task) -> Task:
    """Add `task` under `task.name` (ValueError if the name is taken)."""
    return TASKS.add(task.name, task)


def get_task(name: str) -> Task:
    """The task called `name` (UnknownName, listing the known tasks, if there is none), or
    the user task `module:attr` (imported and registered under that name on first use)."""
    from baton.user_modules import is_spec, load_object

    if name in TASKS or not is_spec(name):
        return TASKS[name]
    obj = load_object(name, "task")
    task = obj() if callable(obj) else obj  # a class or factory; else an instance
    for attr in ("name", "train_rows", "eval_rows", "is_correct"):
        if not hasattr(task, attr):
            raise ValueError(f"task {name!r}: {type(task).__name__} has no {attr!r} (see baton.envs.base.Task)")
    return TASKS.add(name, task) if name not in TASKS else TASKS[name]


def row_fields(task: Task) -> tuple[str, ...]:
    """The fields each of a task's rows needs besides its prompt, checked when a data file
    loads: the task's own `row_fields`, else ("answer",) (what a verifier reads; a task that
    scores rows by other fields says so with `row_fields = (...)`)."""
    return tuple(getattr(task, "row_fields", ("answer",)))
def configured_task(name: str, args: dict[str, Any] | None = None) -> Task:
    """The task `name` configured by the recipe's `data.task_args`: a task that takes arguments
    has `configure(**args) -> Task` (called even with none, so it can say what it needs);
    arguments for a task without one are a ValueError."""
    task = get_task(name)
    configure = getattr(task, "configure", None)
    if configure is None:
        if args:
            raise ValueError(f"data.task_args: task {name!r} takes no arguments (it has no configure())")
        return task
    try:
        return configure(**(args or {}))
    except TypeError as e:  # an argument the task does not take
        raise ValueError(f"data.task_args for task {name!r}: {e}") from None


def row_kwargs(row: Row) -> Row:
    """The fields of a row that go to a reward function as **kwargs (all but the texts)."""
    return {k: v for k, v in row.items() if k not in ("prompt", "completion")}
