"""Structured outputs as grammars: what a request asks for (OpenAI `response_format`, a
forced `tool_choice`, a regex, a JSON schema) as one Lark grammar in llguidance's dialect
(`%json {schema}` embeds a JSON schema), the text `SamplingParams.grammar` carries. The
embedded engine masks the logits with it (`baton.rollout.constrained`); here there is no
llguidance import, only text, so configs and servers check requests without the extra.

    response_format_grammar({"type": "json_schema", "json_schema": {"schema": {...}}})
    tool_call_grammar(tools, name=None)   # Hermes / Qwen `<tool_call>` blocks (tools.py)
    regex_grammar("[0-9]+"), json_schema_grammar({...})

JSON may hold at most one space between tokens (`COMPACT`): a model cannot spend its tokens
on whitespace, and an untrained one still ends its object.
"""

from __future__ import annotations

import json
from typing import Any

# llguidance's JSON options (its `x-guidance` key): at most one space between tokens, so
# `json.dumps`' default (", ", ": ") and its compact form (",", ":") both pass, and a model
# cannot spend its tokens on whitespace (an untrained one still ends its object)
COMPACT = {"whitespace_pattern": " ?"}


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """A grammar whose strings are the JSON documents `schema` accepts."""
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
    return "start: " + _json(schema)


def _json(schema: dict[str, Any]) -> str:
    schema = closed(schema)
    return "%json " + json.dumps({**schema, "x-guidance": {**COMPACT, **schema.get("x-guidance", {})}})


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that lists
    `properties` and says nothing of others: the documents written are still the schema's
    (a subset of them), and a model cannot wander into keys nobody asked for."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k in _SUBSCHEMAS else v for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: closed(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


# keys whose values are schemas (or lists / maps of them) that `closed` walks into
_SUBSCHEMAS = {"items", "anyOf", "oneOf", "allOf", "prefixItems", "$defs", "definitions", "not"}


def regex_grammar(pattern: str) -> str:
    """A grammar whose strings match the regular expression `pattern` (whole)."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("a regex must be a non-empty string")
    return "start: /" + pattern.replace("/", "\\/") + "/"


def response_format_grammar(response_format: Any) -> str | None:
    """OpenAI's `response_format`: {"type": "text"} (None: unconstrained), {"type":
    "json_object"} (any JSON object) or {"type": "json_schema", "json_schema": {"name",
    "schema", "strict"?}}. Anything else: ValueError naming what is wrong."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_grammar({"type": "object"})
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ValueError("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}")
        return json_schema_grammar(schema)
    raise ValueError(f"response_format must be {{'type': 'text' | 'json_object' | 'json_schema', ...}}, "
                     f"got {response_format!r}")


def tool_call_grammar(tools: list[dict[str, Any]], name: str | None = None) -> str:
    """Hermes / Qwen tool calls (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
    what `baton.rollout.server.tools.parse_tool_calls` reads): one call of function `name`,
    or (name None: tool_choice "required") one or more calls of any of `tools`, each with
    arguments matching that function's `parameters` schema. The newlines inside the block
    are optional (Qwen writes them, a compact writer may not)."""
    calls = []
    for t in tools:
        fn = t["function"]
        if name is not None and fn["name"] != name:
            continue
        params = fn.get("parameters") or {"type": "object"}
        calls.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                      "required": ["name", "arguments"], "additionalProperties": False})
    if not calls:
        raise ValueError(f"no tool named {name!r}")
    body = calls[0] if len(calls) == 1 else {"anyOf": calls}
    start = 'start: call\n' if name is not None else 'start: call ("\\n" call)*\n'
    return start + 'call: "<tool_call>" "\\n"? args "\\n"? "</tool_call>"\nargs: ' + _json(body)
