"""The OpenAI gateway shares `baton serve`'s guards (issue 29, `baton.http`):
a 100 MB chat body is a 413 at once (it used to be read and tokenized for minutes, RSS 13 GB,
SIGTERM ignored), /health answers while a prompt is tokenized, non-finite and hostile values
are 4xx (never 500), an unknown `model` is a 404 as in `baton serve`, tools a template cannot
render are a 400, and the official `openai` client shows every error's reason. Real uvicorn on
127.0.0.1 (SIGTERM: `test_gateway.py::test_gateway_main_process`, which runs the process)."""

from __future__ import annotations

import threading

import httpx
import pytest

from baton.rollout.server import ServerThread
from baton.services.gateway import Gateway
from baton.services.gateway_engines import InProcessEngine

from .gateway_fixtures import (JSON, MULTIPLY_TOOL, ScriptedEngine, SlowTokenizer, post_huge, tiny_model,
                               tools_tokenizer)

openai = pytest.importorskip("openai")



@pytest.fixture(scope="module")
def gateway():
    tok = tools_tokenizer()
    gw = Gateway(InProcessEngine(ScriptedEngine(tiny_model(0), tok)), tok, model_name="m")
    with ServerThread(gw.app()) as thread:
        yield gw, thread.url


def _session(url: str) -> str:
    return httpx.post(f"{url}/sessions", json={}, timeout=60).json()["session_id"]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_100mb_chat_body_is_a_413_at_once(gateway, declared):
    gw, url = gateway
    sid = _session(url)
    sent = [0]
    r = post_huge(f"{url}/sessions/{sid}/v1/chat/completions", declared, sent)
    assert r.status_code == 413 and "4 MiB" in r.json()["error"]["message"], r.text[:300]
    assert sent[0] < 64 << 20, sent  # refused while it streams: never read whole (was: no answer in 122 s)
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_health_answers_while_a_prompt_is_tokenized(gateway):
    gw, url = gateway
    real = gw.tok
    slow = gw.tok = SlowTokenizer(real)
    sid = _session(url)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    t = threading.Thread(target=lambda: httpx.post(f"{url}/sessions/{sid}/v1/chat/completions", json=body,
                                                   timeout=60))
    t.start()
    try:
        assert slow.entered.wait(30)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # the loop is free (was: timed out)
    finally:
        slow.gate.set()
        t.join(60)
        gw.tok = real
        gw.abort(sid)


@pytest.mark.parametrize("path,raw,status,needle", [
    ("chat", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, "NaN"),
    ("chat", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}', 400, "overflows"),
    ("chat", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "surrogate"),
    ("chat", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e300}', 422, "max_tokens"),
    ("chat", b'{"messages": [' * 50_000, 400, "nested too deeply"),
    ("chat", b'{"messages": ', 422, "not valid JSON"),
    ("reward", b'{"reward": NaN}', 400, "NaN"),
    ("reward", b'{"reward": -Infinity}', 400, "Infinity"),
    ("reward", b'{"reward": "high"}', 422, "reward"),
])
def test_non_finite_and_hostile_values_are_4xx(gateway, path, raw, status, needle):
    gw, url = gateway
    sid = _session(url)
    target = f"{url}/sessions/{sid}/" + ("v1/chat/completions" if path == "chat" else "reward")
    r = httpx.post(target, content=raw, headers=JSON, timeout=30)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text[:300]
    gw.abort(sid)


@pytest.mark.parametrize("kwargs,error,needle,param", [
    ({"model": "gpt-4"}, "NotFoundError", "this server serves 'm'", "model"),
    ({"n": 2}, "BadRequestError", "n must be 1", "n"),
    ({"tools": [MULTIPLY_TOOL], "tool_choice": "required"}, "BadRequestError", "did not choose", "tool_choice"),
    ({"extra_body": {"top_logprobs": 5, "logprobs": True}}, "BadRequestError", "top_logprobs=5", None),
])
def test_the_official_client_shows_each_errors_reason(gateway, kwargs, error, needle, param):
    gw, url = gateway
    sid = _session(url)
    client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(**{"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 2, **kwargs})
    assert type(exc.value).__name__ == error and needle in str(exc.value) and exc.value.param == param, str(exc.value)
    gw.abort(sid)


def test_tools_need_a_template_that_renders_them():
    """Llama-3-Instruct's template writes no tools: 400 saying so (was: dropped silently)."""
    from tests.agents.conftest import templated_tokenizer

    tok = templated_tokenizer("llama3")
    gw = Gateway(InProcessEngine(ScriptedEngine(tiny_model(0), tok)), tok)
    with ServerThread(gw.app()) as thread:
        sid = _session(thread.url)
        client = openai.OpenAI(base_url=f"{thread.url}/sessions/{sid}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model="baton", messages=[{"role": "user", "content": "6*7?"}],
                                           tools=[{**MULTIPLY_TOOL, "function": {**MULTIPLY_TOOL["function"],
                                                                                 "name": f"multiply{i}"}}
                                                  for i in range(1000)], max_tokens=2)  # names of their own
        assert "does not render tools" in str(exc.value) and "1000 tool definition" in str(exc.value)

