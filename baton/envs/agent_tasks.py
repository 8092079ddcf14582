"""Tasks of the calculator agent recipe, registered on import (`baton.envs` imports this).

multiply     "123*45=" -> "5535": RL prompts for the calculator env (2-3 digit operands;
             a 1M-param model cannot multiply these by itself)
calc_format  the SFT warm start that teaches the call format but not when to use it:
             `copy_rate` of the rows are the conversation after the tool answered -> the
             tool's result copied as the answer; the others are "a*b=" -> the calc tool
             call for `call_rate` of them, and -> the product answered directly (which
             the model cannot learn) for the rest. So the warm model calls the tool in a
             minority of sampled episodes and greedily answers by itself: GRPO has to
             learn that calling pays (the tiny tokenizer's chat template renders user /
             tool text raw and ends assistant turns in <eos>, so these prompts are
             exactly what the episode shows the model)
guess        "7..19=" -> the secret in that range, for the guess env (higher / lower
             each turn, per-turn rewards); the range varies so prompts differ and about
             1 in 10 of them (by the prompt's hash) are held out
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from baton.envs.arithmetic import ArithmeticTask, _heldout
from baton.envs.base import Row, register_task


def call_text(expr: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calc", "arguments": {"expr": expr}},
                                      separators=(",", ":")) + "</tool_call>"


@dataclass
class MultiplyTask(ArithmeticTask):
    name: str = "multiply"
    min_digits: int = 2
    max_digits: int = 3

    def make_row(self, rng: random.Random) -> Row:
        def num() -> int:
            d = rng.randint(self.min_digits, self.max_digits)
            return rng.randint(10 ** (d - 1), 10 ** d - 1)
        a, b = num(), num()
        return {"prompt": f"{a}*{b}=", "answer": str(a * b)}


@dataclass
class CalcFormatTask(MultiplyTask):
    name: str = "calc_format"
    copy_rate: float = 0.4  # rows that copy the tool's result
    call_rate: float = 0.25  # of the other rows, those that call the tool (the rest answer)

    def make_row(self, rng: random.Random) -> Row:
        row = super().make_row(rng)
        expr = row["prompt"][:-1]
        if rng.random() < self.copy_rate:
            return {"prompt": row["prompt"] + call_text(expr) + "<eos>" + row["answer"], "answer": row["answer"]}
        if rng.random() < self.call_rate:
            return {"prompt": row["prompt"], "answer": call_text(expr)}
        return row

    def _rows(self, n: int, seed: int, heldout: bool) -> list[Row]:
        # held out by the multiplication, not by the SFT prompt: RL eval rows stay unseen
        rng, rows = random.Random(seed), []
        while len(rows) < n:
            row = self.make_row(rng)
            if _heldout(row["prompt"].split("=")[0] + "=", self.heldout_every) == heldout:
                rows.append(row)
        return rows


@dataclass
class GuessTask(ArithmeticTask):
    name: str = "guess"
    max_lo: int = 20
    min_width: int = 5
    max_width: int = 20

    def make_row(self, rng: random.Random) -> Row:
        lo = rng.randint(1, self.max_lo)
        hi = lo + rng.randint(self.min_width, self.max_width)
        return {"prompt": f"{lo}..{hi}=", "answer": str(rng.randint(lo, hi))}


register_task(MultiplyTask())
register_task(GuessTask())
register_task(CalcFormatTask())
