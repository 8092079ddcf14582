"""`baton serve` speaks OpenAI tools and streaming: the Hermes/Qwen `<tool_call>` parser,
tools through the chat template, `tool_calls` in responses, and server-sent events that the
official `openai` client parses (real uvicorn on 127.0.0.1, tiny model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from baton.rollout.server.tools import parse_tool_calls
from baton.rollout.server import ServerThread, build_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from services.gateway_fixtures import MULTIPLY_TOOL, ScriptedEngine, tiny_model, tools_tokenizer  # noqa: E402

openai = pytest.importorskip("openai")

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'


def test_parse_tool_calls():
    content, calls = parse_tool_calls("let me see " + CALL)
    assert content == "let me see"
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "multiply", {"a": 6, "b": 7})]
    assert calls[0]["id"].startswith("call_")
    # two calls, string arguments accepted
    two = CALL + '\n<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    content, calls = parse_tool_calls(two)
    assert content == "" and [c["function"]["name"] for c in calls] == ["multiply", "f"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"x": 1}
    # malformed blocks stay in the content; well-formed ones next to them are still parsed
    for bad in ['<tool_call>{"name": "f", "arguments": </tool_call>', '<tool_call>{"arguments": {}}</tool_call>',
                '<tool_call>[1]</tool_call>', '<tool_call>{"name": "f", "arguments": 3}</tool_call>',
                '<tool_call>{"name": "f"']:
        assert parse_tool_calls(bad) == (bad, [])
        content, calls = parse_tool_calls(bad + CALL)
        assert content == bad and len(calls) == 1


def _script(prompt: str) -> str | None:
    if prompt.endswith('"arguments": '):  # tool_choice named a function: its arguments (no closing tag)
        return '{"a": 6, "b": 7}}'
    if prompt.endswith("<tool_call>\n"):  # tool_choice="required": a whole call
        return '{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    if "<tools>" not in prompt:
        return None  # no tools: the real model samples
    return "The answer is 42." if "<tool_response>" in prompt else "calling " + CALL


@pytest.fixture(scope="module")
def tool_server():
    tok = tools_tokenizer()
    engine = ScriptedEngine(tiny_model(0), tok, _script)
    thread = ServerThread(build_app(engine, tok, "tiny-tools"))
    yield thread.url, engine
    thread.stop()


def test_chat_tools_openai_client(tool_server):
    url, engine = tool_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    messages = [{"role": "user", "content": "6*7?"}]
    r = client.chat.completions.create(model="tiny-tools", messages=messages, tools=[MULTIPLY_TOOL])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == "calling"
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "multiply"
    assert json.loads(call.function.arguments) == {"a": 6, "b": 7}
    prompt_text = engine.tokenizer.decode(engine.record[-1][0], skip_special_tokens=False)
    assert prompt_text.startswith("<|im_start|>system\n<tools>multiply</tools><eos>\n")  # tools via the template
    # the agent sends the call back with the tool's result: rendered by the template
    messages += [ch.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    r2 = client.chat.completions.create(model="tiny-tools", messages=messages, tools=[MULTIPLY_TOOL])
    assert r2.choices[0].finish_reason == "stop" and r2.choices[0].message.content == "The answer is 42."
    assert r2.choices[0].message.tool_calls is None
    prompt_text = engine.tokenizer.decode(engine.record[-1][0], skip_special_tokens=False)
    assert prompt_text.endswith('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call><eos>\n'
                                "<|im_start|>user\n<tool_response>42</tool_response><eos>\n<|im_start|>assistant\n")
    # unsupported tool_choice, malformed tools: 400 with a reason
    bad = client.with_options(max_retries=0)
    for kw, why in [({"tool_choice": {"type": "function", "function": {"name": "divide"}}, "tools": [MULTIPLY_TOOL]},
                     "'divide', which is not in `tools`"),
                    ({"tool_choice": "required"}, "needs `tools`"),
                    ({"tools": [{"type": "function"}]}, "tools[0]")]:
        with pytest.raises(openai.BadRequestError) as exc:
            bad.chat.completions.create(model="tiny-tools", messages=messages, **kw)
        assert why in str(exc.value)


def test_stream_chat_tool_calls(tool_server):
    url, _ = tool_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    chunks = list(client.chat.completions.create(model="tiny-tools", messages=[{"role": "user", "content": "6*7?"}],
                                                 tools=[MULTIPLY_TOOL], stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert text == "calling" and len(calls) == 1 and calls[0].function.name == "multiply"
    assert json.loads(calls[0].function.arguments) == {"a": 6, "b": 7}
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_stream_real_sampling_matches_non_stream(tool_server):
    """No tools: the real model samples; a seeded stream equals the seeded plain answer."""
    url, _ = tool_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    kw = dict(model="tiny-tools", messages=[{"role": "user", "content": "hi"}], max_tokens=8, seed=5)
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    # plain completions stream too
    comp = client.completions.create(model="tiny-tools", prompt="1+1=", max_tokens=5, seed=3)
    parts = list(client.completions.create(model="tiny-tools", prompt="1+1=", max_tokens=5, seed=3, stream=True,
                                           stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == comp.choices[0].text
    assert parts[-1].usage.total_tokens == comp.usage.total_tokens
    # the raw event stream: data lines, [DONE] last
    with httpx.Client(base_url=url, timeout=60) as c:
        raw = c.post("/v1/completions", json={"prompt": "1+1=", "max_tokens": 3, "stream": True}).text
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/generate", json={"input_ids": [5, 6], "stream": True})
    assert r.status_code == 400 and "stream" in r.json()["error"]["message"]


@pytest.mark.parametrize("tool_choice,opening", [
    ("required", "<tool_call>\n"),
    ({"type": "function", "function": {"name": "multiply"}}, '<tool_call>\n{"name": "multiply", "arguments": '),
])
def test_tool_choice_required_and_named(tool_server, tool_choice, opening):
    """As vLLM's server: the response is a call (of that function). Without a grammar, baton
    prefills the call's opening after the generation prompt; the model writes the rest."""
    url, engine = tool_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="tiny-tools", messages=[{"role": "user", "content": "6*7?"}],
                                       tools=[MULTIPLY_TOOL], tool_choice=tool_choice)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "multiply" and json.loads(call.function.arguments) == {"a": 6, "b": 7}
    assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
    prompt_text = engine.tokenizer.decode(engine.record[-1][0], skip_special_tokens=False)
    assert prompt_text.endswith("<|im_start|>assistant\n" + opening)


def test_tools_need_a_template_that_renders_them():
    """Llama-3-Instruct's template has no tools: a request with tools is a 400 saying so
    (before: dropped without a word, `prompt_tokens: 6`); Qwen2.5's renders them."""
    from tests.agents.conftest import templated_tokenizer

    from baton.models.tiny import build_tiny_model
    from baton.rollout.server.tools import renders_tools
    from baton.rollout.embedded.engine import EmbeddedEngine

    assert renders_tools(templated_tokenizer("qwen2_5")) and not renders_tools(templated_tokenizer("llama3"))
    tok = templated_tokenizer("llama3")
    model = build_tiny_model(None, vocab_size=len(tok), hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    with ServerThread(build_app(EmbeddedEngine(model.eval(), tok), tok, "llama")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "6*7?"}],
                                           tools=[MULTIPLY_TOOL], max_tokens=2)
        assert "does not render tools" in str(exc.value) and exc.value.param == "tools"
        r = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "6*7?"}],
                                           tools=[MULTIPLY_TOOL], tool_choice="none", max_tokens=2)
        assert r.usage.completion_tokens == 2  # tool_choice "none": no tools to render, served


def test_two_tools_with_one_name_are_a_400(tool_server):
    """Issue 50.10: two functions named alike were accepted (the model could call only one)."""
    url, _ = tool_server
    r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "6*7?"}], "tools": [MULTIPLY_TOOL, MULTIPLY_TOOL]})
    assert r.status_code == 400 and "tools name function 'multiply' twice" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "tools.1"
