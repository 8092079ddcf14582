"""Tasks of the calculator agent recipe, registered on import (`baton.envs` imports this).

multiply     "123*45=" -> "5535": RL prompts for the calculator env (2-3 digit operands;
             a 1M-param model cannot multiply these by itself)
calc_format  stage 1 of the SFT warm start (checkpoints/calc-sft): the call format. Half
             the rows are "a*b=" -> the calc tool call, half are the conversation after
             the tool answered -> the tool's result copied as the answer (the tiny
             tokenizer's chat template renders user / tool text raw and ends assistant
             turns in <eos>, so these prompts are exactly what the episode shows the model)
calc_mixed   stage 2 (checkpoints/calc-sft-mixed, a short SFT from calc-sft): a weak policy
             in the same format. `copy_rate` of the rows copy the tool's result; of the
             others, `call_rate` call the tool and the rest answer the product directly
             (which the model cannot learn). The warm model then calls the tool in ~1 of
             10 sampled episodes and greedily answers by itself, like the model without
             the tool: GRPO has to learn that calling pays
guess        "7..19=" -> the secret in that range, for the guess env (higher / lower
             each turn, per-turn rewards); the range varies so prompts differ and about
             1 in 10 of them (by the prompt's hash) are held out
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from baton.envs.arithmetic import ArithmeticTask
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

    def make_row(self, rng: random.Random) -> Row:
        row = super().make_row(rng)
        expr = row["prompt"][:-1]
        if rng.random() < 0.5:
            return {"prompt": row["prompt"], "answer": call_text(expr)}
        return copy_row(row)

    def heldout_key(self, row: Row) -> str:
        # held out by the multiplication, not by the SFT prompt: RL eval rows stay unseen
        return row["prompt"].split("=")[0] + "="


def copy_row(row: Row) -> Row:
    """The conversation after the tool answered -> its result copied as the answer."""
    return {"prompt": row["prompt"] + call_text(row["prompt"][:-1]) + "<eos>" + row["answer"], "answer": row["answer"]}


@dataclass
class CalcMixedTask(CalcFormatTask):
    name: str = "calc_mixed"
    copy_rate: float = 0.4  # rows that copy the tool's result
    call_rate: float = 0.1  # of the other rows, those that call the tool (the rest answer directly)

    def make_row(self, rng: random.Random) -> Row:
        row = MultiplyTask.make_row(self, rng)
        if rng.random() < self.copy_rate:
            return copy_row(row)
        if rng.random() < self.call_rate:
            return {"prompt": row["prompt"], "answer": call_text(row["prompt"][:-1])}
        return row


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
register_task(CalcMixedTask())
