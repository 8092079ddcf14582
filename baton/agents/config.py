"""`AgentConfig`: the recipe's `agent:` section (multi-turn episodes with tools)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TRUNCATION = ("truncate", "drop")


@dataclass
class AgentConfig:
    env: str = "calculator"  # an AGENT_ENVS name (baton.agents.envs)
    env_args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the env
    tools: list[str] | None = None  # offer only these of the env's tools (None: all)
    max_turns: int = 4  # policy turns per trajectory
    max_tokens: int = 256  # response tokens per trajectory (policy + observation + boundary)
    turn_max_new_tokens: int = 64  # tokens one turn may generate (cut by the remaining budget)
    # past max_tokens / max_turns: "truncate" ends the trajectory there, finish_reason
    # "length", scored with reward 0 (no answer); "drop" removes it from its group, counted
    truncation: str = "truncate"
    tool_timeout_s: float = 10.0  # per tool call
    env_timeout_s: float = 30.0  # per env start / step
    trajectory_timeout_s: float = 300.0  # whole trajectory, generation included
    chat_template: str | None = None  # a jinja file; None: the tokenizer's own template

    def check(self) -> None:
        from baton.agents.envs import AGENT_ENVS

        if self.env not in AGENT_ENVS:
            raise ValueError(f"agent.env: unknown env {self.env!r}; known: {sorted(AGENT_ENVS)}")
        if self.truncation not in TRUNCATION:
            raise ValueError(f"agent.truncation must be one of {TRUNCATION}, got {self.truncation!r}")
        for name in ("max_turns", "max_tokens", "turn_max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("tool_timeout_s", "env_timeout_s", "trajectory_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"agent.{name} must be > 0, got {getattr(self, name)}")
        known = AGENT_ENVS[self.env].TOOLS
        bad = [t for t in (self.tools or []) if t not in known]
        if bad:
            raise ValueError(f"agent.tools: {bad} are not tools of env {self.env!r}; it has {sorted(known)}")
