"""A custom environment (docs/EXTENDING.md, part 3): what `baton env --env my_env:ModSumEnvironment`
runs against inference servers and the trajectory API.

An environment is called as `factory(tokenizer, **options)` (options: group_size,
max_new_tokens, temperature, top_p, seed); `TaskEnvironment` does the sampling and scoring
over a task, so this one only picks the task and overrides `score` to add a length penalty.
"""

from baton.envs import TaskEnvironment
from my_task import ModSumTask


class ModSumEnvironment(TaskEnvironment):
    def __init__(self, tokenizer, **options):
        options.setdefault("max_new_tokens", 4)
        super().__init__(ModSumTask(), tokenizer, **options)

    def score(self, item, completions):
        return [(1.0 if self.task.is_correct(c, item) else 0.0) - 0.01 * len(c) for c in completions]
