"""The demo task: multi-term integer arithmetic, e.g. prompt "3+5+8=" -> completion "16".

Short prompts and answers suit a tiny char-level model, the answer is checked exactly, and
the difficulty is tunable (number of terms, operand range, operators) so a warm-started
model can sit in the middle - right often enough for GRPO groups to contain both correct
and wrong samples, wrong often enough to leave room to learn.

Held-out prompts are chosen by a hash of the prompt text (about 1 in 10), and training rows
never include them, so "held-out accuracy" really is on unseen problems whatever seeds or
sizes are used.
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass, field

from baton.envs.base import Row
from baton.rewards.registry import register_reward

_INT = re.compile(r"-?\d+")


def _heldout(prompt: str, every: int) -> bool:
    # crc32, not hash(): Python's str hash changes between processes.
    return zlib.crc32(prompt.encode()) % every == 0


def clean_completion(completion: str) -> str:
    """Drop what decoding may leave around an answer: a literal <eos> and surrounding space."""
    return completion.split("<eos>", 1)[0].strip()


def verify(completion: str, answer: str) -> bool:
    """Exact check: the completion is the answer and nothing else (modulo outer whitespace)."""
    return clean_completion(completion) == str(answer).strip()


@register_reward("arithmetic/correct")
def correctness(prompt: str, completion: str, answer: str | None = None, **_) -> float:
    """1.0 if the completion is exactly the answer, else 0.0."""
    return 1.0 if answer is not None and verify(completion, answer) else 0.0


@register_reward("arithmetic/format")
def format_reward(prompt: str, completion: str, **_) -> float:
    """1.0 if the completion is a single integer (the right shape, right or wrong), else 0.0."""
    return 1.0 if _INT.fullmatch(clean_completion(completion)) else 0.0


def _value(terms: list[int], ops: list[str]) -> int:
    """The value of terms[0] ops[0] terms[1] ...: `*` binds first, `+` and `-` left to right
    (what Python's eval of the expression gives, ~20x faster than compiling it)."""
    total, sign, product = 0, 1, terms[0]
    for op, t in zip(ops, terms[1:]):
        if op == "*":
            product *= t
        else:
            total, sign, product = total + sign * product, 1 if op == "+" else -1, t
    return total + sign * product


_DRAWN: dict[tuple, list[Row]] = {}  # ArithmeticTask._rows's draws in this process, by their inputs
_DRAWN_KEEP = 8  # ~5 MB each at the default train_size


@dataclass
class ArithmeticTask:
    name: str = "arithmetic"
    # Defaults: sums of 2-5 single digits. A 0.8M model learns them in a few hundred SFT
    # steps, so a short warm start lands mid-way (~30-40% sampled) and GRPO has room to
    # climb. Larger operands (max_value=99) take thousands of steps to learn (carries).
    min_terms: int = 2
    max_terms: int = 5
    max_value: int = 9  # operands are drawn from 0..max_value
    ops: str = "+"  # allowed operators between terms: any of "+-*"
    train_size: int = 20_000
    heldout_every: int = 10  # ~1/heldout_every of all prompts are held out
    eval_seed: int = 12_345
    reward_weights: dict[str, float] = field(
        default_factory=lambda: {"arithmetic/correct": 1.0, "arithmetic/format": 0.1})

    def __post_init__(self) -> None:
        if not 1 <= self.min_terms <= self.max_terms:
            raise ValueError(f"need 1 <= min_terms <= max_terms, got {self.min_terms}, {self.max_terms}")
        if self.max_value < 1 or not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"bad max_value={self.max_value} or ops={self.ops!r} (ops from '+-*')")

    def make_row(self, rng: random.Random) -> Row:
        k = rng.randint(self.min_terms, self.max_terms)
        terms = [rng.randint(0, self.max_value) for _ in range(k)]
        ops = [rng.choice(self.ops) for _ in terms[1:]]
        expr = str(terms[0]) + "".join(op + str(t) for op, t in zip(ops, terms[1:]))
        return {"prompt": expr + "=", "answer": str(_value(terms, ops))}

    def _rows(self, n: int, seed: int, heldout: bool) -> list[Row]:
        """`n` rows of one side of the split, drawn from `seed`: a pure function of the task's
        fields, n, seed and side, so runs in one process (the Python API, a sweep, the test
        suite) draw them once (20,000 rows are ~0.45 s); each caller gets its own dicts."""
        key = (type(self), repr(self), n, seed, heldout)
        if key not in _DRAWN:
            if len(_DRAWN) >= _DRAWN_KEEP:
                _DRAWN.pop(next(iter(_DRAWN)))  # the oldest
            _DRAWN[key] = self._draw(n, seed, heldout)
        return [dict(r) for r in _DRAWN[key]]

    def _draw(self, n: int, seed: int, heldout: bool) -> list[Row]:
        rng, rows = random.Random(seed), []
        tries = 0
        while len(rows) < n:
            tries += 1
            if tries > 1000 * n + 10_000:
                raise RuntimeError("task space too small for the requested number of rows")
            row = self.make_row(rng)
            if _heldout(self.heldout_key(row), self.heldout_every) == heldout:
                rows.append(row)
        return rows

    def heldout_key(self, row: Row) -> str:
        """The text whose hash decides whether a row is held out (the problem, not its wording)."""
        return row["prompt"]

    def train_rows(self, n: int | None = None, seed: int = 0) -> list[Row]:
        return self._rows(self.train_size if n is None else n, seed, heldout=False)

    def eval_rows(self, n: int = 200) -> list[Row]:
        return self._rows(n, self.eval_seed, heldout=True)

    def target(self, row: Row) -> str:
        return str(row["answer"])

    def is_correct(self, completion: str, row: Row) -> bool:
        return verify(completion, row["answer"])
