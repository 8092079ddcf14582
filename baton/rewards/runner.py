"""Run reward functions over completions: weights, timeouts, and errors that do not kill a run.

A reward function has the TRL-style signature `reward(prompt, completion, **row) -> float`,
where `row` carries the dataset fields of the sample (e.g. `answer`). Functions are named
in config either by a registered name (`REWARD_FUNCTIONS`, which tasks fill) or by an
import path `package.module:function`.

Every call runs in a worker thread with a timeout. A function that raises or runs past
its timeout scores 0 for that sample; the failure is counted in the returned stats
(`reward/errors`, `reward/timeouts`) and the first message of each kind is logged, so a bad
verifier is visible but the step goes on. Python cannot kill a thread: a hung call keeps
its thread until it returns, so the pool is replaced and the hung thread abandoned.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import logging
from dataclasses import dataclass
from typing import Any, Callable

RewardFn = Callable[..., float]
REWARD_FUNCTIONS: dict[str, RewardFn] = {}
log = logging.getLogger(__name__)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def wrap(fn: RewardFn) -> RewardFn:
        REWARD_FUNCTIONS[name] = fn
        return fn
    return wrap


def resolve_reward(name: str) -> RewardFn:
    """A registered name, or `package.module:function`."""
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        fn = getattr(importlib.import_module(module), attr, None)
        if callable(fn):
            return fn
        raise ValueError(f"reward function {name!r}: {module} has no callable {attr!r}")
    raise ValueError(f"unknown reward function {name!r}; registered: {sorted(REWARD_FUNCTIONS)} "
                     f"(or give 'package.module:function')")


@dataclass
class RewardStats:
    """Failures per sample (a sample with two failing functions counts two)."""
    errors: list[int]
    timeouts: list[int]

    @classmethod
    def zeros(cls, n: int) -> "RewardStats":
        return cls([0] * n, [0] * n)


class RewardRunner:
    def __init__(self, functions: dict[str, float], timeout_s: float = 5.0, max_workers: int = 4):
        if not functions:
            raise ValueError("at least one reward function is needed")
        self.fns = {name: (resolve_reward(name), float(w)) for name, w in functions.items()}
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self._pool = cf.ThreadPoolExecutor(max_workers, thread_name_prefix="reward")

    def score(self, prompts: list[str], completions: list[str], rows: list[dict[str, Any]]
              ) -> tuple[list[float], dict[str, list[float]], RewardStats]:
        """Weighted total per sample, the per-function scores, and failure counts."""
        stats = RewardStats.zeros(len(prompts))
        per_fn: dict[str, list[float]] = {}
        for name, (fn, _) in self.fns.items():
            futures = [self._pool.submit(fn, p, c, **r) for p, c, r in zip(prompts, completions, rows)]
            # One deadline for the whole column: every call gets about timeout_s of a thread.
            waves = -(-len(futures) // self.max_workers)
            _, late = cf.wait(futures, timeout=self.timeout_s * max(waves, 1))
            if late:
                for i, f in enumerate(futures):
                    stats.timeouts[i] += f in late
                log.warning("reward function %r timed out on %d sample(s) (%.1fs each); scoring 0",
                            name, len(late), self.timeout_s)
                for f in late:
                    f.cancel()
                # Python cannot kill a hung thread: abandon this pool, start a fresh one.
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = cf.ThreadPoolExecutor(self.max_workers, thread_name_prefix="reward")
            per_fn[name] = [0.0 if f in late else self._result(name, f, stats, i)
                            for i, f in enumerate(futures)]
        totals = [sum(w * per_fn[name][i] for name, (_, w) in self.fns.items())
                  for i in range(len(prompts))]
        return totals, per_fn, stats

    def _result(self, name: str, future: cf.Future, stats: RewardStats, row: int) -> float:
        try:
            return float(future.result(timeout=0))
        except Exception as e:  # a verifier bug must not end the run
            stats.errors[row] += 1
            if sum(stats.errors) == 1:
                log.warning("reward function %r raised %s: %s; scoring 0", name, type(e).__name__, e)
            return 0.0
