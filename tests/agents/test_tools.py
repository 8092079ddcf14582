"""Tool schemas from signatures, <tool_call> parse statuses, per-trajectory tool objects."""

from __future__ import annotations

import asyncio

from baton.agents.tools import MALFORMED, NONE, OK, UNKNOWN_TOOL, ToolCall, ToolSet, function_schema, parse_tool_calls


def add(a: int, b: float = 1.0) -> float:
    """Add two numbers.

    a: the first
    b: the second"""
    return a + b


class Counter:
    """A stateful tool: one instance per trajectory."""
    closed = 0

    def __init__(self):
        self.n = 0

    def bump(self, by: int) -> int:
        """Increase the counter.

        by: the step"""
        self.n += by
        return self.n

    def close(self):
        Counter.closed += 1


def test_schema():
    s = function_schema(add)
    assert s == {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "the first"},
            "b": {"type": "number", "description": "the second"}}, "required": ["a"]}}}


def test_parse_statuses():
    known = frozenset({"add"})
    assert parse_tool_calls("just 42", known)[1] == NONE
    calls, st, _ = parse_tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>', known)
    assert st == OK and calls == [ToolCall("add", {"a": 1})]
    assert parse_tool_calls('<tool_call>{"name": "add", </tool_call>', known)[1] == MALFORMED
    assert parse_tool_calls('<tool_call>{"name": "add"', known)[1] == MALFORMED
    assert parse_tool_calls('<tool_call>{"name": "sub", "arguments": {}}</tool_call>', known)[1] == UNKNOWN_TOOL


def test_stateful_tool_per_trajectory():
    spec = ToolSet([add, Counter])
    a, b = spec.fresh(), spec.fresh()
    assert a.names == {"add", "bump"}

    async def go():
        await a.call(ToolCall("bump", {"by": 2}), 1.0)
        r = await a.call(ToolCall("bump", {"by": 3}), 1.0)
        s = await b.call(ToolCall("bump", {"by": 1}), 1.0)
        bad = await a.call(ToolCall("add", {"c": 1}), 1.0)  # wrong arguments: text for the model
        await a.close()
        await b.close()
        return r, s, bad

    r, s, bad = asyncio.run(go())
    assert (r, s) == ("5", "1") and bad.startswith("error:") and Counter.closed == 2


def test_calc_tool():
    from baton.agents.envs import calc

    assert calc("12*34") == "408" and calc("12*") == "error: not an expression"
    assert calc("__import__('os')").startswith("error:")


def test_two_tools_with_one_name_are_refused():
    """Issue 50.10: the second silently replaced the first."""
    import pytest

    def calc(expr: str) -> str:
        """Another calc."""
        return expr

    class Calc:
        def calc(self, expr: str) -> str:
            """A method named like a function."""
            return expr

    with pytest.raises(ValueError, match="two tools are named 'calc'"):
        ToolSet.build([calc, Calc])
