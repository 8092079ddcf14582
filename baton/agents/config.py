"""`AgentConfig`: the recipe's `agent:` section (multi-turn episodes with tools);
`GatewayAgentConfig`: its `gateway:` section (an OpenAI-speaking agent through the gateway)."""

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
    max_observation_chars: int = 32768  # a longer tool / env message is cut with a marker, counted (agent/cut/*)
    max_failed_steps: int = 3  # draws in a row with no finished trajectory before AgentFailureError

    def check(self) -> None:
        from baton.agents.envs import AGENT_ENVS

        if self.env not in AGENT_ENVS:
            raise ValueError(f"agent.env: unknown env {self.env!r}; known: {sorted(AGENT_ENVS)}")
        if self.truncation not in TRUNCATION:
            raise ValueError(f"agent.truncation must be one of {TRUNCATION}, got {self.truncation!r}")
        for name in ("max_turns", "max_tokens", "turn_max_new_tokens", "max_observation_chars", "max_failed_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("tool_timeout_s", "env_timeout_s", "trajectory_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"agent.{name} must be > 0, got {getattr(self, name)}")
        check_args = getattr(AGENT_ENVS[self.env], "check_args", None)
        if check_args is not None:  # an env that validates its env_args (openenv: the URL, the extra)
            check_args(self.env_args)
        known = AGENT_ENVS[self.env].TOOLS
        bad = [t for t in (self.tools or []) if t not in known]
        if bad:
            raise ValueError(f"agent.tools: {bad} are not tools of env {self.env!r}; it has {sorted(known)}")


@dataclass
class GatewayAgentConfig:
    """The recipe's `gateway:` section (data.source: gateway, baton/agents/gateway_run.py): an
    agent that only speaks the OpenAI API, `async def agent(base_url, api_key, row) -> float`,
    run `rollout.n` times per prompt against session-scoped endpoints of a gateway in front of
    the rollout engine; each session's recorded tokens are a row, the returned float its reward."""
    agent: str = ""  # "module:attr" of the async agent function
    max_tokens: int = 256  # per request that gives no max_tokens
    max_session_tokens: int | None = None  # token budget of one session (past it: a 400 the agent sees)
    session_timeout_s: float = 300.0  # an agent running longer is dropped ("deadline"), never scored 0
    max_failed_steps: int = 3  # draws in a row with no finished session before AgentFailureError

    def check_task(self, task: str) -> None:
        """An agent made for one task's rows (its function's `requires_task`, e.g. the verifiers
        environments' `episode`) refused with any other `data.task`, before anything runs."""
        from baton.user_modules import load_object

        need = getattr(load_object(self.agent, "gateway.agent"), "requires_task", None)
        if need is not None and task != need:
            raise ValueError(f"gateway.agent={self.agent} runs rows of data.task={need}, got data.task={task}: "
                             f"set data.task={need}")

    def check(self) -> None:
        import inspect

        from baton.user_modules import is_spec, load_object

        if not is_spec(self.agent):
            raise ValueError(f"gateway.agent must be a 'module:attr' async function, got {self.agent!r}")
        fn = load_object(self.agent, "gateway.agent")
        if not inspect.iscoroutinefunction(fn):
            raise ValueError(f"gateway.agent {self.agent!r} is not an async function "
                             f"(async def agent(base_url, api_key, row) -> float)")
        if self.max_tokens < 1 or self.max_failed_steps < 1 or (self.max_session_tokens is not None
                                                                and self.max_session_tokens < 1):
            raise ValueError("gateway.max_tokens, gateway.max_failed_steps and gateway.max_session_tokens must be >= 1")
        if not self.session_timeout_s > 0:
            raise ValueError(f"gateway.session_timeout_s must be > 0, got {self.session_timeout_s}")
