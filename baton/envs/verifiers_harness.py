"""A verifiers (0.4, `verifiers.v1`) harness whose chat loop runs in this process: what
`baton.envs.verifiers_env` seats in a verifiers environment's agent so that its episodes run
against baton's gateway without a program to install (imported only with the verifiers extra).

verifiers runs an agent as a harness *program* (its `null` / `bash` chat loops are PEP 723
scripts that `uv` resolves from a package index; the others need containers). Its Harness
contract allows the loop in-process "as long as every model call goes through `endpoint` +
`secret`" (`Harness.launch`'s docstring): this harness is that loop, verifiers' `null` loop
in ~40 lines. Each model call goes to the rollout's interception server (`endpoint`), which
applies the task's `@vf.stop` / `@vf.intercept` hooks and limits, records the turn on the
trace and forwards it to the run's client (here a gateway session). A reply with tool calls
runs them on the task's MCP tool servers (`mcp_urls`, verifiers' own MCP client helpers) and
asks again; a reply without is the end of the segment. Resumed segments (an env's
`interaction.turn(text)`: the env answers, the model replies) relaunch on the whole
conversation (`SUPPORTS_RESUME`), which continues the gateway session's token sequence.

verifiers' loader imports harnesses by top-level name only, so this module is registered as
`HARNESS_ID` in `sys.modules` when imported.
"""

from __future__ import annotations

import json
import sys
from contextlib import AsyncExitStack
from typing import Any

import verifiers.v1 as vf
from openai import AsyncOpenAI

HARNESS_ID = "baton_inprocess"  # the harness id (`AgentConfig.harness.id`) this module answers to


class InProcessHarnessConfig(vf.HarnessConfig):
    id: str = HARNESS_ID  # a model call's max_tokens: the gateway's (gateway.max_tokens)


class InProcessHarness(vf.Harness[InProcessHarnessConfig]):
    """verifiers' tool-calling chat loop, in-process (module docstring)."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any) -> vf.ProgramResult:
        from verifiers.v1.dialects.chat import message_to_wire
        from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp

        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [message_to_wire(m) for m in prompt or []]
        # no per-call timeout: the session's deadline bounds the episode (gateway.session_timeout_s);
        # the SDK's 5 s connect timeout dropped ~1 session in 100 on a loaded 2-core machine
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=None)
        try:
            async with AsyncExitStack() as stack:
                config = {"mcpServers": {name: {"url": url, "timeout": self.config.tool_timeout}
                                         for name, url in mcp_urls.items()}}
                tools, dispatch, servers = await connect_mcp(config, stack, set()) if mcp_urls else ([], {}, {})
                kw = {"tools": tools} if tools else {}
                while True:
                    reply = await client.chat.completions.create(model=ctx.model, messages=messages, **kw)
                    message = reply.choices[0].message
                    messages.append(message.model_dump(exclude_none=True))
                    if not message.tool_calls:
                        return vf.ProgramResult(0, "", "")
                    for call in message.tool_calls:
                        try:
                            args = json.loads(call.function.arguments or "{}")
                        except json.JSONDecodeError as e:
                            args, content = None, f"error: invalid JSON in tool arguments ({e})"
                        if isinstance(args, dict):
                            content = (await call_mcp(servers, dispatch, call.function.name, args)
                                       if call.function.name in dispatch else
                                       f"error: unknown tool {call.function.name!r}")
                        elif args is not None:
                            content = "error: tool arguments must be a JSON object"
                        messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                                         "content": content})
        finally:
            await client.close()


__all__ = ["InProcessHarness"]  # verifiers' loader takes the one Harness subclass __all__ exports
sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])
