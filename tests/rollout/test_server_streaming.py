"""Streaming that streams: `baton serve` (and the gateway) send the tokens as the engine
samples them (a real tiny Qwen2 behind real uvicorn on 127.0.0.1, the official `openai`
client): several chunks arrive, their text joins to the non-streamed answer, a stop
string is never sent even in part, the usage chunk comes when asked."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from baton.rollout.server import ServerThread
from baton.rollout.server.stream import TextDeltas, held_back
from baton.services.gateway import Gateway
from baton.services.gateway_engines import InProcessEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from services.gateway_fixtures import tiny_model, tools_tokenizer  # noqa: E402

openai = pytest.importorskip("openai")

MSG = [{"role": "user", "content": "tell me"}]


def test_held_back():
    # the tail that begins a stop string waits; a tail that cannot begin one goes
    assert held_back("abc<st", ["<stop>"]) == 3
    assert held_back("abc<", ["<stop>", "xy"]) == 1
    assert held_back("abcx", ["<stop>", "xy"]) == 1
    assert held_back("abc", ["<stop>"]) == 0
    assert held_back("", ["<stop>"]) == 0


def test_text_deltas_hold_stop_and_tool_calls():
    tok = tools_tokenizer()  # one character a token
    ids = lambda s: list(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    d = TextDeltas(tok, ["END"])
    assert d.push(ids("hi E"), False) == "hi "  # "E" may begin "END"
    assert d.push(ids("Nx"), False) == "ENx"  # it did not
    assert d.push(ids("EN"), False) == ""
    assert d.push(ids("D"), True) == ""  # stopped: the answer ("hi ENx") gives the rest
    assert d.rest("hi ENx") == ""
    t = TextDeltas(tok, [], tools=True)
    assert t.push(ids("ok <tool"), False) == "ok"  # a call may begin; whitespace waits (content is stripped)
    assert t.push(ids('_call>{"name"'), False) == ""
    assert t.rest("ok") == ""


@pytest.fixture(scope="module")
def server():
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.rollout.server import build_app

    tok = tools_tokenizer()
    engine = EmbeddedEngine(tiny_model(0), tok)
    thread = ServerThread(build_app(engine, tok, "tiny"))
    yield thread.url, tok
    thread.stop()


def _client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_chat_streams_token_by_token(server):
    url, _ = server
    client = _client(url)
    kw = dict(model="tiny", messages=MSG, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    parts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(parts) >= 8  # streamed as sampled, not one chunk at the end
    assert "".join(parts) == plain.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens
    # without include_usage: no usage chunk
    again = list(client.chat.completions.create(model="tiny", messages=MSG, max_tokens=6, temperature=0,
                                                stream=True))
    assert all(c.choices for c in again)


def test_stop_string_never_sent_across_chunks(server):
    """A stop string that spans several one-token chunks: no chunk holds any of it."""
    url, _ = server
    client = _client(url)
    kw = dict(model="tiny", prompt="once upon", max_tokens=30, seed=3, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0].text  # a seeded sample: varied text
    stop = full[10:13]  # three tokens in the middle: the stream must hold them back
    cut = full.find(stop)
    assert 3 <= cut <= 10
    plain = client.completions.create(**kw, stop=[stop])
    assert plain.choices[0].text == full[:cut] and plain.choices[0].finish_reason == "stop"
    parts = list(client.completions.create(**kw, stop=[stop], stream=True))
    texts = [p.choices[0].text for p in parts if p.choices and p.choices[0].text]
    assert len(texts) >= 3 and "".join(texts) == full[:cut]
    sent = ""
    for t in texts:  # at no time did the client hold text past the cut
        sent += t
        assert full[:cut].startswith(sent)
    assert parts[-1].choices[0].finish_reason == "stop"


def test_seeded_samples_stream_per_choice(server):
    url, _ = server
    client = _client(url)
    kw = dict(model="tiny", messages=MSG, max_tokens=12, n=2, seed=7, temperature=1.0)
    plain = client.chat.completions.create(**kw, logprobs=True)
    chunks = list(client.chat.completions.create(**kw, stream=True, logprobs=True))
    for ch in plain.choices:
        got = "".join(c.choices[0].delta.content or "" for c in chunks
                      if c.choices and c.choices[0].index == ch.index)
        assert got == ch.message.content
        lps = [e for c in chunks if c.choices and c.choices[0].index == ch.index and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]
        assert [(e.token, e.logprob) for e in lps] == [(e.token, e.logprob) for e in ch.logprobs.content]


def test_refused_stream_is_a_4xx(server):
    url, _ = server
    with httpx.Client(base_url=url) as c:
        r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 10**6, "stream": True})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]


def test_gateway_streams_token_by_token():
    tok = tools_tokenizer()
    from baton.rollout.embedded.engine import EmbeddedEngine

    gw = Gateway(InProcessEngine(EmbeddedEngine(tiny_model(0), tok)), tok, model_name="m")
    thread = ServerThread(gw.app())
    try:
        sid = httpx.post(f"{thread.url}/sessions").json()["session_id"]
        client = openai.OpenAI(base_url=f"{thread.url}/sessions/{sid}/v1", api_key="unused", max_retries=0)
        chunks = list(client.chat.completions.create(model="m", messages=MSG, max_tokens=16, temperature=0,
                                                     stream=True, stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True}))
        parts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        traj = httpx.get(f"{thread.url}/sessions/{sid}").json()
        sampled = [t for t, m in zip(traj["tokens"], traj["mask"]) if m]
        assert len(parts) >= 6 and "".join(parts) == tok.decode(sampled, skip_special_tokens=True)
        assert chunks[-1].usage.completion_tokens == len(sampled) == 16
    finally:
        thread.stop()


def test_client_leaving_mid_stream_cancels_its_generation():
    """A client that closes the stream after its first chunk: the generation nobody reads is
    cancelled between decode steps. The engine's decode steps are slowed (50 ms each) after 3 steps until
    the server has withdrawn the request, so the race is under the test's control."""
    import threading
    import time

    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.rollout.server import build_app

    tok = tools_tokenizer()
    engine = EmbeddedEngine(tiny_model(0), tok)
    gate, steps, decode = threading.Event(), [0], engine.runner.decode

    def gated(*args, **kwargs):
        steps[0] += 1
        if steps[0] > 3 and not gate.is_set():  # slowed, not stopped: chunks still flush between slices
            time.sleep(0.05)
        return decode(*args, **kwargs)

    engine.runner.decode = gated
    app = build_app(engine, tok, "tiny")
    thread = ServerThread(app)
    batcher = app.state.baton.batcher

    def wait_for(cond) -> bool:
        deadline = time.monotonic() + 60
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.02)
        return cond()

    try:
        body = {"prompt": "go", "max_tokens": 1000, "ignore_eos": True, "stream": True,
                "seed": 0}
        with httpx.Client(base_url=thread.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
            first = next(line for line in r.iter_lines() if line.startswith("data: "))
            assert '"text"' in first
        assert wait_for(lambda: batcher.stats["cancelled"] == 1  # withdrawn (or already cancelled)
                        or any(j.stop.is_set() for j in list(batcher._running)))
        gate.set()
        assert wait_for(lambda: batcher.stats["cancelled"] == 1)
        assert steps[0] < 1000  # cancelled, not run to its 1,000 tokens
    finally:
        gate.set()
        thread.stop()
