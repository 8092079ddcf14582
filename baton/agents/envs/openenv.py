"""`agent.env: openenv`: an OpenEnv environment server (openenv-core) as a multi-turn agent env,
one WebSocket session (one `reset`, then `step`s) per trajectory.

    agent:
      env: openenv
      env_args: {url: http://127.0.0.1:8011, action_field: guess}

start   connects to `{url}/ws`, `reset(seed=...)`: `seed` is the row's "seed" when it has one,
        else crc32 of its prompt (the n trajectories of a prompt play the same episode); the
        user message is the observation's text
step    `action_field` set: the turn's text is the action `{action_field: text}`, the step's
        observation the next user message. `action_field` null (an MCP environment, served
        with CallToolAction): the server's MCP tools (`list_tools`) are offered to the model,
        each call is a `call_tool` step, its result a tool message; a turn without a call ends
        the episode (score through a tool, e.g. a submit tool that sets done and reward)
reward  the step that ends the episode (done) gives the trajectory's final reward; earlier
        steps' rewards are the per-turn rewards of their turns (sum: the episode's return)
text    an observation's text is its `observation_field` when set, else its fields (but
        done / reward / metadata) as JSON; a tool result is its `data`, else its text content

A tool error the model caused (invalid_args, tool_not_found) is shown to it as "error: ...";
any other tool error, a server error or a lost connection is an env fault: the trajectory is
dropped and counted (agent.env_timeout_s bounds every reset / step). openenv-core (the
`openenv` extra) is imported only by a run that chooses this env, once, before its
trajectories start (`prepare`), so its import is never counted against a trajectory.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from baton.agents.episode import AssistantTurn, Observation, Start
from baton.agents.tools import NONE, OK, AgentFault

MODEL_ERRORS = ("invalid_args", "tool_not_found")  # shown to the model; other tool errors drop
ARGS = {"url": str, "action_field": (str, type(None)), "observation_field": (str, type(None))}


def check_args(env_args: dict[str, Any]) -> None:
    """agent.env_args of `openenv` (and the extra installed), before anything runs."""
    from baton.user_modules import require_extra

    require_extra("openenv", "openenv", "agent.env=openenv")
    bad = sorted(set(env_args) - set(ARGS))
    if bad:
        raise ValueError(f"agent.env_args: {bad} are not arguments of env 'openenv'; it takes {sorted(ARGS)}")
    url = env_args.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://", "ws://", "wss://")):
        raise ValueError(f"agent.env_args.url: env 'openenv' needs the server's http(s):// or ws(s):// URL, got {url!r}")
    for k, types in ARGS.items():
        if k in env_args and not isinstance(env_args[k], types):
            raise ValueError(f"agent.env_args.{k} must be a string{' or null' if k != 'url' else ''}, got {env_args[k]!r}")


def episode_seed(row: dict[str, Any]) -> int:
    return int(row["seed"]) if "seed" in row else zlib.crc32(str(row.get("prompt", "")).encode())


def observation_text(obs: dict[str, Any], field: str | None) -> str:
    if field is not None:
        if field not in obs:
            raise AgentFault("env_error", f"observation has no field {field!r}: {sorted(obs)}")
        return obs[field] if isinstance(obs[field], str) else json.dumps(obs[field])
    rest = {k: v for k, v in obs.items() if k not in ("done", "reward", "metadata")}
    return json.dumps(rest, sort_keys=True)


def tool_result_text(obs: dict[str, Any]) -> str:
    err = obs.get("error")
    if err:
        if err.get("error_type") in MODEL_ERRORS:
            return f"error: {err.get('message', '')}"
        raise AgentFault("tool_timeout" if err.get("error_type") == "timeout" else "tool_error",
                         f"{obs.get('tool_name')}: {err.get('error_type')}: {err.get('message', '')}")
    res = obs.get("result")
    if isinstance(res, dict):
        if res.get("data") is not None:
            res = res["data"]
        elif res.get("content"):
            res = "".join(c.get("text", "") for c in res["content"] if isinstance(c, dict))
    return res if isinstance(res, str) else json.dumps(res)


class RemoteTools:
    """The server's MCP tools, as the episode protocol sees a ToolSet (names, schemas)."""

    def __init__(self, tools: list[dict[str, Any]]):
        self._schemas = [{"type": "function", "function": {
            "name": t["name"], "description": t.get("description", ""),
            "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}} for t in tools]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(s["function"]["name"] for s in self._schemas)

    def schemas(self) -> list[dict[str, Any]]:
        return self._schemas


class OpenEnvEpisode:
    TOOLS: dict = {}  # discovered from the server at start (MCP environments), not named in the recipe
    check_args = staticmethod(check_args)

    def __init__(self, row: dict[str, Any], tools: list[str] | None = None, tool_timeout_s: float = 10.0,
                 url: str = "", action_field: str | None = None, observation_field: str | None = None):
        self.row, self.url = row, url
        self.action_field, self.observation_field = action_field, observation_field
        self.tools: RemoteTools | None = None
        self.client: Any = None

    async def _step(self, action: dict[str, Any]) -> tuple[dict[str, Any], float, bool]:
        try:
            r = await self.client.step(action)
        except RuntimeError as e:  # the server's error reply (e.g. an action its schema refuses)
            raise AgentFault("env_error", str(e)) from e
        return r.observation, float(r.reward or 0.0), bool(r.done)

    @staticmethod
    def prepare() -> None:
        """openenv's import (4.5 s of CPU), once per process before trajectories start
        (`baton.agents.rollout.prepare_env`), never under agent.env_timeout_s."""
        import openenv  # noqa: F401

    async def start(self) -> Start:
        from openenv import GenericEnvClient  # imported by prepare(): a lookup here

        self.client = GenericEnvClient(base_url=self.url)  # each call under agent.env_timeout_s
        r = await self.client.reset(seed=episode_seed(self.row))
        messages = [{"role": "user", "content": observation_text(r.observation, self.observation_field)}]
        if self.action_field is None:
            listed, _, _ = await self._step({"type": "list_tools"})
            self.tools = RemoteTools(listed.get("tools", []))
            return Start(messages, self.tools.schemas() or None)
        return Start(messages)

    async def step(self, turn: AssistantTurn) -> Observation:
        if self.action_field is not None:
            obs, reward, done = await self._step({self.action_field: turn.text.strip()})
            return self._observation([{"role": "user", "content": observation_text(obs, self.observation_field)}],
                                     reward, done)
        if turn.status not in (OK, NONE):
            return Observation([{"role": "tool", "content": f"error: {turn.error}"}])
        if turn.status == NONE:
            return Observation(done=True)
        out, total, done = [], 0.0, False
        for c in turn.calls:
            obs, reward, done = await self._step({"type": "call_tool", "tool_name": c.name, "arguments": c.arguments})
            out.append({"role": "tool", "content": tool_result_text(obs)})
            total += reward
            if done:
                break
        return self._observation(out, total, done)

    @staticmethod
    def _observation(messages: list[dict[str, Any]], reward: float, done: bool) -> Observation:
        if done:  # the last step's reward is the trajectory's; earlier ones stay per-turn
            return Observation(done=True, final_reward=reward)
        return Observation(messages, reward=reward)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
