"""The reward role: scores completions with rule-based reward functions.

Consumes rows with `prompt`, `completion` and the task's fields (e.g. `answer`); produces
`rewards` [B] (the weighted sum), one `reward/<name>` column per function, and per-row
failure counts (`reward_errors`, `reward_timeouts`, `reward_nonfinite`, and `reward_calls`;
logged summed as `reward/errors`, ...; a run stops after `reward.max_failed_steps` steps in a
row where every call failed: `baton.trainers.session.run.RewardFailureGuard`). Calls run in worker processes with a deadline each: functions that
raise, exit, hang or return NaN/inf score 0 and are counted (see baton.rewards.runner)
instead of ending or poisoning the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import baton.envs  # noqa: F401  (importing registers the tasks' reward functions)
from baton import fields as F
from baton.batch import Batch
from baton.controller import Dispatch, Worker, register
from baton.rewards.runner import RewardRunner, resolve_reward

PASSED_THROUGH = {F.PROMPT_TEXT, F.COMPLETION_TEXT, F.FINISH_REASON}


@dataclass
class RewardConfig:
    """The recipe's `reward:` section: reward-function name -> weight, and a per-call timeout."""
    functions: dict[str, float] = field(default_factory=lambda: {"arithmetic/correct": 1.0})
    timeout_s: float = 5.0
    max_workers: int = 4  # calls in flight at once (worker processes); more for latency-bound verifiers
    max_failed_steps: int = 3  # stop after this many steps in a row where every reward call failed

    # Pickled (to a Ray worker process), the section carries the Python callables its names
    # refer to (`baton.train(reward_funcs=[fn])`: baton.rewards.python), registered on arrival.
    def __getstate__(self) -> dict:
        from baton.rewards.python import shipped

        return {**self.__dict__, "_python_rewards": shipped(self.functions)}

    def __setstate__(self, state: dict) -> None:
        from baton.rewards.python import receive

        state = dict(state)
        receive(state.pop("_python_rewards", {}))
        self.__dict__.update(state)

    def check(self) -> None:
        if not self.functions:
            raise ValueError("reward.functions is empty: name at least one reward function")
        for name in self.functions:
            try:
                resolve_reward(name)
            except ValueError as e:
                raise ValueError(f"reward.functions: {e}") from None
        if self.timeout_s <= 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_workers < 1 or self.max_failed_steps < 1:
            raise ValueError(f"reward.max_workers and reward.max_failed_steps must be >= 1, got "
                             f"{self.max_workers}, {self.max_failed_steps}")


class RewardWorker(Worker):
    batch_on_device = False  # reward functions read text on the CPU, whatever the slot's device

    def __init__(self, reward: RewardConfig):
        super().__init__()
        self.runner = RewardRunner(reward.functions, timeout_s=reward.timeout_s, max_workers=reward.max_workers)

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # returns a future
    def compute_rewards(self, batch: Batch) -> Batch:
        extra = [k for k in batch.non_tensors if k not in PASSED_THROUGH]
        rows = [{k: batch.non_tensors[k][i] for k in extra} for i in range(len(batch))]
        totals, per_fn, stats = self.runner.score(list(batch[F.PROMPT_TEXT]),
                                                  list(batch[F.COMPLETION_TEXT]), rows)
        return Batch({F.REWARDS: torch.tensor(totals, dtype=torch.float32),
                      **{f"reward/{k}": torch.tensor(v, dtype=torch.float32) for k, v in per_fn.items()},
                      # per row, so that the counts of every data-parallel rank add up
                      **{f"reward_{k}": torch.tensor(v) for k, v in stats.columns().items()},
                      "reward_calls": torch.full((len(batch),), len(self.runner.names))})
