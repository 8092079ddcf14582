"""Structured outputs for `baton serve` and the gateway: the grammar a request asks for.

OpenAI's `response_format` (json_object, json_schema) and a forced `tool_choice` ("required",
or a named function) become one grammar (`baton.rollout.grammars`) that the embedded engine
enforces by constrained decoding (`baton.rollout.constrained`, llguidance): the answer is
guaranteed to parse and match the schema, whatever the model (a completion cut by
max_tokens is the exception, finish_reason "length", as OpenAI's). SGLang's /generate
`json_schema` and `regex`, and baton's `grammar` (a Lark grammar), take the same path.

An engine without constrained decoding (`structured_outputs` not set: vLLM here) refuses
`response_format` with a 400 and gets a forced tool_choice the old way: the prompt is
prefilled with the call's opening (tools.forced_opening), which is not a guarantee. Without
the `structured` extra a request that needs it is a 400 naming the install command.
"""

from __future__ import annotations

import json
from typing import Any

from baton.http import APIError
from baton.rollout.grammars import regex_grammar, response_format_grammar, tool_call_grammar


def constrains(engine: Any) -> bool:
    """Whether `engine` enforces `SamplingParams.grammar`."""
    return engine.structured_outputs


def check(grammar: str | None) -> str | None:
    """`grammar`, compiled once to check it: a bad one or a missing extra is a 400."""
    if grammar is None:
        return None
    from baton.rollout.constrained import check_grammar

    try:
        check_grammar(grammar)
    except (ImportError, ValueError) as exc:
        raise APIError(400, str(exc), code="structured_outputs") from exc
    return grammar


def chat_grammar(engine: Any, response_format: Any, tools: list[dict[str, Any]] | None,
                 tool_choice: Any) -> str | None:
    """The grammar of a chat request (None: unconstrained, or a forced tool_choice the engine
    cannot constrain: the caller prefills instead)."""
    forced = tools is not None and tool_choice not in (None, "auto", "none")
    try:
        fmt = response_format_grammar(response_format)
    except ValueError as exc:
        raise APIError(400, str(exc), param="response_format") from exc
    if fmt is not None and forced:
        raise APIError(400, "response_format and a forced tool_choice ask for two different answers: give one",
                       param="response_format")
    if fmt is not None and not constrains(engine):
        raise APIError(400, f"response_format needs constrained decoding, which this server's engine "
                            f"({type(engine).__name__}) does not do", param="response_format")
    if forced and constrains(engine):
        name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
        fmt = tool_call_grammar(tools, name)
    return check(fmt)


def generate_grammar(engine: Any, json_schema: str | None, regex: str | None, grammar: str | None) -> str | None:
    """/generate's sampling_params: SGLang's `json_schema` (a JSON string) and `regex`, and
    baton's `grammar` (a Lark grammar); at most one."""
    given = [(k, v) for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar))
             if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise APIError(400, f"give one of json_schema, regex and grammar, not {[k for k, _ in given]}")
    if not constrains(engine):
        raise APIError(400, f"{given[0][0]} needs constrained decoding, which this server's engine "
                            f"({type(engine).__name__}) does not do")
    try:
        if json_schema is not None:
            return check(response_format_grammar({"type": "json_schema",
                                                  "json_schema": {"schema": json.loads(json_schema)}}))
        return check(regex_grammar(regex) if regex is not None else grammar)
    except ValueError as exc:  # json.loads, or a schema that is not an object
        raise APIError(400, f"{given[0][0]}: {exc}") from exc
