"""OpenAI tool calling for `baton serve` and the gateway: messages in, tool calls out.

Tools reach the model through the tokenizer's chat template
(`apply_chat_template(messages, tools=...)`, OpenAI function format), and the model's text
is parsed for Hermes / Qwen blocks

    <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>

into OpenAI `tool_calls` (id, type "function", function.name, function.arguments as a
JSON string). A block that is not a JSON object with a string `name` and object
`arguments` stays in `content` as the model wrote it (the agent sees it; nothing crashes).

Assistant messages an agent sends back carry `tool_calls` with `arguments` as JSON strings;
templates (Qwen2.5's among them) expect a dict, so `message_dicts` decodes them.

A request with `tools` for a model whose chat template does not write tool definitions
(probed once per template: `renders_tools`) is a 400 saying so: the tools are never dropped
without a word.

`tool_choice` as vLLM's server takes it: "auto" / "none", "required" (some call) and
{"type": "function", "function": {"name": ...}} (that function). The embedded engine forces
the last two with a grammar (`structured.py`): the call parses and its arguments match the
function's schema. For an engine without constrained decoding, `forced_opening` gives the
text the prompt is prefilled with: the opening of a Hermes block, `<tool_call>\n` (required)
or `<tool_call>\n{"name": "NAME", "arguments": ` (named). The model writes the rest; a model
that does not finish a well-formed block gets its text back as content, with no tool call.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from fastapi import HTTPException

from baton.http import APIError

TOOL_CALL_RE = re.compile(r"<tool_call>((?:(?!<tool_call>).)*?)</tool_call>", re.DOTALL)  # innermost block


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(content, tool_calls): the well-formed `<tool_call>` blocks become OpenAI tool calls
    and leave the content; malformed ones stay in it. Content is stripped of the
    whitespace the removed blocks leave behind."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in TOOL_CALL_RE.finditer(text):
        call = _parse_one(m.group(1))
        if call is None:
            continue  # malformed: stays in the text
        kept.append(text[pos:m.start()])
        pos = m.end()
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call[0], "arguments": json.dumps(call[1], ensure_ascii=False)}})
    if not calls:
        return text, []
    kept.append(text[pos:])
    return "".join(kept).strip(), calls


def _parse_one(body: str) -> tuple[str, dict[str, Any]] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], args


def message_dicts(messages: list[Any]) -> list[dict[str, Any]]:
    """Chat messages (pydantic `ChatMessage`s) as the dicts chat templates read."""
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            d["tool_calls"] = [_template_call(c) for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args) if args.strip() else {}
        except ValueError as exc:
            raise HTTPException(400, f"tool_calls: arguments of {fn.get('name')!r} are not JSON: {exc}") from exc
    return {"id": call.get("id"), "type": call.get("type", "function"), "function": fn}


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI assistant message (ours) as chat templates read it (arguments as dicts)."""
    out = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [_template_call(c) for c in message["tool_calls"]]
    return out


def check_tools(tools: list[Any] | None, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The request's tools (OpenAI function format), or a 400 naming what is wrong."""
    if not (tool_choice in (None, "auto", "none", "required") or _named(tool_choice) is not None):
        raise APIError(400, f"tool_choice={tool_choice!r} is not one of 'auto', 'none', 'required' or "
                            f"{{'type': 'function', 'function': {{'name': ...}}}}", param="tool_choice")
    if not tools or tool_choice == "none":
        if tool_choice not in (None, "auto", "none"):
            raise APIError(400, f"tool_choice={tool_choice!r} needs `tools`", param="tool_choice")
        return None
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict) \
                or not isinstance(t["function"].get("name"), str):
            raise APIError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                                f"'parameters': {{...}}}}}}", param=f"tools.{i}")
    names = [t["function"]["name"] for t in tools]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise APIError(400, f"tools name function {twice!r} twice: each tool needs a name of its own",
                       param=f"tools.{names.index(twice, names.index(twice) + 1)}")
    name = _named(tool_choice)
    if name is not None and name not in names:
        raise APIError(400, f"tool_choice names function {name!r}, which is not in `tools`", param="tool_choice")
    return list(tools)


def _named(tool_choice: Any) -> str | None:
    """The function a named tool_choice forces ({"type": "function", "function": {"name"}})."""
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        return name if isinstance(name, str) and name else None
    return None


def forced_opening(tool_choice: Any) -> str:
    """The text a forced tool_choice prefills the assistant turn with ("" when not forced)."""
    name = _named(tool_choice)
    if name is not None:
        return '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": '
    return "<tool_call>\n" if tool_choice == "required" else ""


def forced_message(opening: str, text: str) -> tuple[dict[str, Any], bool]:
    """`assistant_message` for a turn prefilled with `opening`: a block the model ended at its
    end-of-turn without `</tool_call>` is closed for it."""
    message, called = assistant_message(opening + text, parse=True)
    if not called and "</tool_call>" not in text:
        message, called = assistant_message(opening + text + "</tool_call>", parse=True)
    return message if called else {"role": "assistant", "content": opening + text}, called


PROBE_TOOL_NAME = "baton_probe_tool_5e1d"
_RENDERS_TOOLS: dict[str, bool] = {}  # chat template text -> whether it writes tool definitions


def renders_tools(tok: Any) -> bool:
    """Whether `tok`'s chat template writes the definitions of the tools it is given
    (rendered once per template with a probe tool whose name cannot occur otherwise)."""
    template = getattr(tok, "chat_template", None)
    key = template if isinstance(template, str) else repr(template)  # a str's hash is cached; a dict of templates: its repr
    if key not in _RENDERS_TOOLS:
        probe = {"type": "function", "function": {"name": PROBE_TOOL_NAME, "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}
        try:
            text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[probe], tokenize=False,
                                           add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - a template that fails with tools does not render them
            text = ""
        _RENDERS_TOOLS[key] = PROBE_TOOL_NAME in str(text)
    return _RENDERS_TOOLS[key]


def render(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           add_generation_prompt: bool, **kwargs: Any) -> str:
    """The chat template's text; a template error is the client's input (400)."""
    if not getattr(tok, "chat_template", None):
        raise HTTPException(400, "the tokenizer has no chat template; use /v1/completions")
    if tools and not renders_tools(tok):
        raise APIError(400, f"this model's chat template does not render tools, so the model would never see the "
                            f"{len(tools)} tool definition(s): send the request without `tools` (or serve a model "
                            f"whose template renders them, e.g. Qwen2.5's)", param="tools", code="tools_not_supported")
    try:
        if tools:
            kwargs["tools"] = tools
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                       **kwargs)
    except Exception as exc:  # noqa: BLE001 - template errors are the client's input
        raise HTTPException(400, f"chat template failed: {exc}") from exc


def assistant_message(text: str, parse: bool) -> tuple[dict[str, Any], bool]:
    """(the OpenAI assistant message for a completion's text, whether it holds tool calls)."""
    if parse:
        content, calls = parse_tool_calls(text)
        if calls:
            return {"role": "assistant", "content": content or None, "tool_calls": calls}, True
    return {"role": "assistant", "content": text}, False
