"""A verifiers (0.4, `verifiers.v1`) taskset written as a user would: sums of two digits,
"3+5=" -> "8", one `@vf.reward` (exact match). recipes/envs/grpo_verifiers.yaml trains on it as
`data.task_args.taskset: recipes.envs.vf_sums` (verifiers' loader imports the module and takes
the Taskset subclass its __all__ exports); tests/envs/test_verifiers.py tests it."""

from __future__ import annotations

import random

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


class SumsConfig(vf.TasksetConfig):
    n: int = 300
    seed: int = 0


class Sums(vf.Taskset[SumTask, SumsConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.n):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            yield SumTask(SumData(prompt=f"{a}+{b}=", answer=str(a + b)), self.config.task)


__all__ = ["Sums"]
