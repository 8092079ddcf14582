"""The multi-turn episode protocol: one `Episode` object per trajectory, async.

    ep = env.episode(row)                 # row: a task row (prompt, answer, ...)
    start = await ep.start()              # Start(messages, tools): the conversation so far
    out = await ep.step(turn)             # turn: AssistantTurn (text, parsed calls, status)
    # out: Observation(messages=[...], reward=per-turn or None, done, final_reward)
    await ep.close()

`ToolEpisode` is the usual base: it runs the turn's tool calls (each under the per-call
deadline), turns a malformed / unknown call into a tool message the model reads, and asks
the subclass `finish(turn)` whether a turn without calls ends the episode and what it
scores. Exceptions from a tool or env are NOT caught here: the rollout counts them by kind
and drops the trajectory from its group (never a silent 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from baton.agents.tools import NONE, OK, ToolCall, ToolSet


@dataclass
class Start:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None  # OpenAI function schemas for the template


@dataclass
class AssistantTurn:
    text: str  # the decoded policy tokens of this turn (no end-of-turn token)
    calls: list[ToolCall]
    status: str  # ok | malformed | unknown_tool | none
    error: str = ""  # parse error shown to the model


@dataclass
class Observation:
    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None  # per-turn reward for the turn just taken
    done: bool = False
    final_reward: float = 0.0  # trajectory reward, read when done


class Episode(Protocol):
    tools: ToolSet | None

    async def start(self) -> Start: ...

    async def step(self, turn: AssistantTurn) -> Observation: ...

    async def close(self) -> None: ...


class ToolEpisode:
    """Episode with tools. Subclasses set `messages` in __init__ and implement
    `finish(turn) -> Observation` for a turn without tool calls (e.g. score the answer)."""

    tool_timeout_s: float = 5.0

    def __init__(self, messages: list[dict[str, Any]], tools: list[Any] | None = None):
        self.messages = messages
        self.tools = ToolSet.build(tools or [])

    async def start(self) -> Start:
        return Start(self.messages, self.tools.schemas() or None)

    async def step(self, turn: AssistantTurn) -> Observation:
        if turn.status not in (OK, NONE):
            return Observation([{"role": "tool", "content": f"error: {turn.error}"}])
        if turn.status == NONE:
            return self.finish(turn)
        out = [await self.tools.call(c, self.tool_timeout_s) for c in turn.calls]
        return Observation([{"role": "tool", "content": r} for r in out])

    def finish(self, turn: AssistantTurn) -> Observation:
        raise NotImplementedError

    async def close(self) -> None:
        await self.tools.close()
