"""Tools for agent episodes: plain functions or per-trajectory objects, their OpenAI function
schemas, and parsing of Hermes/Qwen `<tool_call>{...}</tool_call>` blocks from model text.

    def add(a: int, b: int) -> int:
        '''Add two integers.

        a: the first term
        b: the second term'''
    tools = ToolSet.build([add, Notebook])   # Notebook: a class, one instance per trajectory
    tools.schemas()                          # [{"type": "function", "function": {...}}]
    calls, status = parse_tool_calls(text, tools.names)   # status: ok | malformed | unknown_tool | none

A stateful tool is a class: `ToolSet.build` instantiates it once per trajectory (`fresh()`)
and every public method becomes a tool; its `close()` (if any) runs when the trajectory
ends. Sync tools run in a daemon thread of their own per call (`in_daemon_thread`) so a
deadline can be enforced: a hung sync function cannot be killed, so its thread is left
behind and the trajectory dropped; being a daemon, it never keeps the process from exiting
(a pool's threads are joined at interpreter exit: one hung tool would hang the program).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("baton")
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def in_daemon_thread(fn: Callable[[], Any], name: str = "baton-tool") -> asyncio.Future:
    """`fn()` in a daemon thread of its own; a future of the running loop for its result.
    Not a pool, not asyncio's default executor: both are joined at interpreter exit, so a
    call that never returns would keep the process alive after training ended."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():  # abandoned at its deadline: nobody waits any more
            fut.set_result(value) if ok else fut.set_exception(value)

    def run() -> None:
        try:
            out = (True, fn())
        except Exception as e:  # noqa: BLE001 - handed to the awaiting trajectory
            out = (False, e)
        except BaseException as e:  # noqa: BLE001 - sys.exit() in a tool is the tool's error
            out = (False, RuntimeError(f"{type(e).__name__}: {e}"))
        try:
            loop.call_soon_threadsafe(settle, *out)
        except RuntimeError:  # the loop is closed: the trajectory is long gone
            pass

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


_NOTED: set[str] = set()


def note_fault(kind: str, message: str) -> None:
    """Log the first fault of each kind in this process (later ones are only counted)."""
    if kind not in _NOTED:
        _NOTED.add(kind)
        log.warning("agent fault %s (the first; the rest are counted as agent/dropped/%s): %s", kind, kind,
                    message[:500])


class AgentFault(RuntimeError):
    """A fault that drops its trajectory from the group; `kind` is what the rollout counts.
    Logged (`note_fault`) where it is counted, as every drop is, not where it is raised."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


# parse statuses of one assistant turn
OK, MALFORMED, UNKNOWN_TOOL, NONE = "ok", "malformed", "unknown_tool", "none"


def function_schema(fn: Callable, name: str | None = None) -> dict[str, Any]:
    """OpenAI function-tool schema from a signature and docstring. The docstring's first
    paragraph is the description; lines `name: text` describe parameters."""
    doc = inspect.getdoc(fn) or ""
    head, _, rest = doc.partition("\n\n")
    arg_doc = dict(m.groups() for m in re.finditer(r"^\s*(\w+)\s*:\s*(.+)$", rest, re.M))
    props, required = {}, []
    hints = {}
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to strings
        pass
    for arg, p in inspect.signature(fn).parameters.items():
        if arg == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        prop: dict[str, Any] = {"type": _JSON_TYPES.get(hints.get(arg), "string")}
        if arg in arg_doc:
            prop["description"] = arg_doc[arg].strip()
        props[arg] = prop
        if p.default is inspect.Parameter.empty:
            required.append(arg)
    return {"type": "function", "function": {
        "name": name or fn.__name__, "description": head.strip(),
        "parameters": {"type": "object", "properties": props, "required": required}}}


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


def parse_tool_calls(text: str, known: set[str] | frozenset[str]) -> tuple[list[ToolCall], str, str]:
    """(calls, status, error) of one assistant turn's text. status: "none" (no call), "ok",
    "malformed" (a block that is not JSON {"name", "arguments": object}, or an unclosed
    <tool_call>), "unknown_tool". error: one line for the model to read (empty when ok)."""
    blocks = _CALL.findall(text)
    if not blocks:
        if "<tool_call>" in text:
            return [], MALFORMED, "unclosed <tool_call>"
        return [], NONE, ""
    calls = []
    for b in blocks:
        try:
            obj = json.loads(b.strip())
        except json.JSONDecodeError as e:
            return [], MALFORMED, f"tool call is not valid JSON: {e.msg}"
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)
                and isinstance(obj.get("arguments", {}), dict)):
            return [], MALFORMED, 'tool call must be {"name": str, "arguments": object}'
        if obj["name"] not in known:
            return [], UNKNOWN_TOOL, f"unknown tool {obj['name']!r}; tools: {sorted(known)}"
        calls.append(ToolCall(obj["name"], obj.get("arguments", {})))
    return calls, OK, ""


@dataclass
class ToolSet:
    """The tools of an episode. `specs`: functions and classes as given (or one dict
    {tool name: function or class}); `fresh()` returns a
    per-trajectory instance (classes instantiated) whose `call` runs one tool call."""
    specs: list[Any]
    _fns: dict[str, Callable] = field(default_factory=dict)
    _objects: list[Any] = field(default_factory=list)

    @classmethod
    def build(cls, specs: list[Any]) -> "ToolSet":
        return cls(list(specs)).fresh()

    def fresh(self) -> "ToolSet":
        out = ToolSet(self.specs)
        specs = self.specs[0].items() if len(self.specs) == 1 and isinstance(self.specs[0], dict) \
            else [(None, s) for s in self.specs]
        for given, s in specs:
            if inspect.isclass(s):
                obj = s()
                out._objects.append(obj)
                for name, m in inspect.getmembers(obj, inspect.ismethod):
                    if not name.startswith("_") and name != "close":
                        out._add(name, m)
            elif callable(s):
                out._add(given or s.__name__, s)
            else:
                raise TypeError(f"a tool is a function or a class, got {type(s).__name__}")
        return out

    def _add(self, name: str, fn: Callable) -> None:
        """One tool by name; a second of that name is a ValueError (the model could call only one)."""
        if name in self._fns:
            raise ValueError(f"two tools are named {name!r}: each tool needs a name of its own")
        self._fns[name] = fn

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._fns)

    def schemas(self) -> list[dict[str, Any]]:
        return [function_schema(f, name) for name, f in self._fns.items()]

    async def call(self, call: ToolCall, timeout_s: float) -> str:
        """Run one call with a deadline. Arguments that do not fit the signature are the
        model's mistake: returned as text. A timeout or an exception -> AgentFault."""
        fn = self._fns[call.name]
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as e:
            return f"error: {e}"
        try:
            if inspect.iscoroutinefunction(fn):
                result = await asyncio.wait_for(fn(**call.arguments), timeout_s)
            else:
                result = await asyncio.wait_for(in_daemon_thread(lambda: fn(**call.arguments)), timeout_s)
        except asyncio.TimeoutError:
            raise AgentFault("tool_timeout", f"{call.name} ran past {timeout_s}s") from None
        except Exception as e:  # noqa: BLE001 - any tool failure drops the trajectory, counted
            raise AgentFault("tool_error", f"{call.name}: {type(e).__name__}: {e}") from e
        return result if isinstance(result, str) else json.dumps(result)

    async def close(self) -> None:
        for obj in self._objects:
            close = getattr(obj, "close", None)
            if close is not None:
                r = close()
                if inspect.isawaitable(r):
                    await r
