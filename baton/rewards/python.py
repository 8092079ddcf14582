"""Reward functions given as Python objects (`baton.train(..., reward_funcs=[fn])`), not by name.

    names = register_callables([lambda completion, answer, **_: float(completion.strip() == answer)])
    # -> {"python/lambda": 1.0}: what `reward.functions` holds; `resolve_reward` finds them

Each callable is wrapped in a `PythonReward`, which the reward runner calls per row like any
reward, `reward(prompt=..., completion=..., **row) -> float`, whatever its shape:
  * per row (baton's shape): `fn(prompt, completion, **row) -> float`; a function that takes
    no `**kwargs` is given only the fields it names (`lambda completion, answer: ...`);
  * batched (TRL's shape, recognised by a parameter named `prompts` or `completions`):
    `fn(prompts=[...], completions=[...], **{field: [...]}) -> list[float]`, called with
    lists of one row (the runner's per-call deadline and failure counting stay per row);
  * async (`async def`, or a call that returns an awaitable): run to completion on an event
    loop of the calling thread.

The names are `python/<the function's __name__>` (`python/lambda` for a lambda; `_2`, `_3`
for a second of the same name in one call); registering a name again replaces it (a notebook
cell run twice means its new function). They live in this process's `PYTHON_REWARDS`. A Ray
worker process gets them with its `RewardConfig` (`shipped` / `receive`: Ray's cloudpickle
sends the functions by value); a function Ray cannot send is refused before the run starts
(`baton.python_api`), in one line saying why. A run dir's config.yaml names them, so such a
run resumes from Python (the same call with `trainer.resume=auto`), not from `baton train`.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
from typing import Any, Callable

PREFIX = "python/"
PYTHON_REWARDS: dict[str, "PythonReward"] = {}  # name -> wrapped callable, in this process
_LOOPS = threading.local()  # an event loop per calling thread, for async reward functions


def _parameters(fn: Callable[..., Any]) -> tuple[set[str], bool]:
    """(the parameter names `fn` takes by keyword, whether it takes **kwargs)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: give it everything
        return set(), True
    kinds = inspect.Parameter
    names = {p.name for p in sig.parameters.values() if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
    return names, any(p.kind == kinds.VAR_KEYWORD for p in sig.parameters.values())


def _await(value: Any) -> Any:
    if not inspect.isawaitable(value):
        return value
    loop = getattr(_LOOPS, "loop", None)
    if loop is None or loop.is_closed():
        loop = _LOOPS.loop = asyncio.new_event_loop()
    return loop.run_until_complete(value)


class PythonReward:
    """A user's callable as a reward function (see the module docstring for the shapes)."""

    def __init__(self, fn: Callable[..., Any], name: str):
        if not callable(fn):
            raise ValueError(f"reward function {name!r}: {fn!r} is not callable")
        self.fn, self.name = fn, name
        self.params, self.any_kwargs = _parameters(fn)
        self.batched = bool({"prompts", "completions"} & self.params)

    def _fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        return fields if self.any_kwargs else {k: v for k, v in fields.items() if k in self.params}

    def __call__(self, prompt: Any, completion: str, **row: Any) -> float:
        if self.batched:
            fields = {"prompts": [prompt], "completions": [completion], **{k: [v] for k, v in row.items()}}
            out = _await(self.fn(**self._fields(fields)))
            if not isinstance(out, (list, tuple)) or len(out) != 1:
                raise TypeError(f"a batched reward function returns a list of one score per completion, "
                                f"got {type(out).__name__}")
            return out[0]
        return _await(self.fn(**self._fields({"prompt": prompt, "completion": completion, **row})))

    def __repr__(self) -> str:
        return f"<reward {self.name}: {getattr(self.fn, '__qualname__', self.fn)!r}>"


def _base_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    name = "lambda" if name == "<lambda>" else name
    return PREFIX + (re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "reward")


def register_callables(funcs: Any) -> dict[str, float]:
    """`reward.functions` for `funcs`: a callable, a list of callables (weight 1 each) and/or
    registered names, or a mapping {callable or name: weight}. Callables are wrapped and
    registered in `PYTHON_REWARDS`; names are kept as they are."""
    if callable(funcs) or isinstance(funcs, str):
        funcs = [funcs]
    pairs = list(funcs.items()) if isinstance(funcs, dict) else [(f, 1.0) for f in funcs]
    if not pairs:
        raise ValueError("reward_funcs is empty: give at least one reward function")
    out: dict[str, float] = {}
    for fn, weight in pairs:
        if isinstance(fn, str):
            out[fn] = float(weight)
            continue
        if isinstance(fn, PythonReward):
            fn = fn.fn
        base, k = _base_name(fn), 1
        name = base
        while name in out:
            k += 1
            name = f"{base}_{k}"
        PYTHON_REWARDS[name] = PythonReward(fn, name)
        out[name] = float(weight)
    return out


def shipped(functions: dict[str, float]) -> dict[str, PythonReward]:
    """The Python reward functions among `functions`' names (what a `RewardConfig` carries
    to another process)."""
    return {name: PYTHON_REWARDS[name] for name in functions if name in PYTHON_REWARDS}


def receive(rewards: dict[str, PythonReward]) -> None:
    """Register the Python reward functions a `RewardConfig` brought into this process."""
    PYTHON_REWARDS.update(rewards)
