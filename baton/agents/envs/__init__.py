"""Multi-turn environments, by name in `AGENT_ENVS` (the recipe's `agent.env`).

calculator  multi-digit multiplication with a `calc` tool; reward 1 for the exact product
            as the final answer (a turn without a tool call)
openenv     an OpenEnv server's episodes (`openenv.py` here; the openenv extra)
guess       guess a number in [lo, hi] (from a prompt "LO..HI=" as the task `guess` writes,
            else env_args lo / hi): the env answers "higher" / "lower" (+ env_args suffix);
            per-turn reward 0.1 for a guess consistent with all feedback so far, final
            reward 1 if found
An env class is built per trajectory as `Env(row, tools=..., tool_timeout_s=..., **env_args)`.
"""

from __future__ import annotations

import random
import re

from baton.agents.episode import AssistantTurn, Observation, ToolEpisode
from baton.agents.envs.openenv import OpenEnvEpisode
from baton.agents.tools import NONE
from baton.registry import Registry

AGENT_ENVS: Registry = Registry("agent env")


def register_env(name: str):
    return AGENT_ENVS.register(name)


def calc(expr: str) -> str:
    """Evaluate an integer expression of + - * and parentheses.

    expr: the expression, e.g. 123*45"""
    if not re.fullmatch(r"[\d+\-*() ]{1,64}", expr):
        return "error: only digits, + - * and parentheses"
    try:  # a bad expression is the model's mistake, shown to it (not a tool fault)
        return str(eval(expr, {"__builtins__": {}}))  # noqa: S307 - the regex admits arithmetic only
    except SyntaxError:
        return "error: not an expression"


def _select(tools: dict, names: list[str] | None) -> list:
    return [{n: tools[n] for n in (names if names is not None else tools)}]


@register_env("calculator")
class CalculatorEnv(ToolEpisode):
    TOOLS = {"calc": calc}

    def __init__(self, row: dict, tools: list[str] | None = None, tool_timeout_s: float = 10.0):
        super().__init__([{"role": "user", "content": row["prompt"]}], _select(self.TOOLS, tools))
        self.answer, self.tool_timeout_s = str(row["answer"]).strip(), tool_timeout_s

    def finish(self, turn: AssistantTurn) -> Observation:
        return Observation(done=True, final_reward=float(turn.text.strip() == self.answer))


def multiplication_rows(n: int, digits: int = 3, seed: int = 0) -> list[dict]:
    """Rows {"prompt": "123*456=", "answer": "56088"} for the calculator env."""
    rng = random.Random(seed)
    lo, hi = 10 ** (digits - 1), 10 ** digits - 1
    out = []
    for _ in range(n):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        out.append({"prompt": f"{a}*{b}=", "answer": str(a * b)})
    return out


@register_env("guess")
class GuessEnv(ToolEpisode):
    """Per-turn feedback: each turn is a guess (an integer); no tools."""
    TOOLS: dict = {}

    def __init__(self, row: dict, tools: list[str] | None = None, tool_timeout_s: float = 10.0,
                 lo: int = 1, hi: int = 20, suffix: str = ""):
        prompt = row.get("prompt", f"guess {lo}-{hi}:")
        given = re.fullmatch(r"(\d+)\.\.(\d+)=", prompt)
        self.suffix = suffix  # e.g. "=": the arithmetic warm start answers a number after it
        super().__init__([{"role": "user", "content": prompt}], [])
        self.secret = int(row["answer"])
        self.lo, self.hi = (int(given[1]), int(given[2])) if given else (lo, hi)

    async def step(self, turn: AssistantTurn) -> Observation:
        text = turn.text.strip()
        if not re.fullmatch(r"-?\d+", text):
            return Observation([{"role": "user", "content": "a number" + self.suffix}], reward=0.0)
        g = int(text)
        consistent = self.lo <= g <= self.hi
        if g == self.secret:
            return Observation(reward=0.1 if consistent else 0.0, done=True, final_reward=1.0)
        if g < self.secret:
            self.lo = max(self.lo, g + 1)
        else:
            self.hi = min(self.hi, g - 1)
        return Observation([{"role": "user", "content": ("higher" if g < self.secret else "lower") + self.suffix}],
                           reward=0.1 if consistent else 0.0)

    def finish(self, turn: AssistantTurn) -> Observation:  # unused: step handles every turn
        raise AssertionError(NONE)


register_env("openenv")(OpenEnvEpisode)
