"""`baton serve` stays responsive and answers what it accepts (issues 22 §2, 21 §5): a body
cap, tokenizing off the event loop, /health telling busy from wedged, admin endpoints a web
page cannot reach, top-N logprobs past 20 refused, an unknown response_format refused, unknown model names 404,
a request log line. Real HTTP against a tiny model on 127.0.0.1."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import pytest

from baton.rollout.embedded.engine import EmbeddedEngine
from tests.services.gateway_fixtures import SlowTokenizer

GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


def _chunks(total: int, size: int = 512 << 10):
    """A body without Content-Length (chunked): the server must count it as it streams."""
    for _ in range(total // size):
        yield b" " * size


def test_request_bodies_are_capped(served, fresh_served):
    """Issue 32: a 6 MB prompt is refused by size (413) by default, before it is parsed or
    tokenized (it used to take 8.7 s of tokenizing to a 400); /generate's token-id batches
    have their own, larger cap."""
    with httpx.Client(base_url=served.url, timeout=30) as c:
        r = c.post("/v1/completions", json={"prompt": "x" * (6 << 20), "max_tokens": 1})
        assert r.status_code == 413 and "4 MiB" in r.json()["error"]["message"], r.text[:300]
        assert r.json()["error"]["code"] == "body_too_large"
        r = c.post("/v1/chat/completions", content=_chunks(6 << 20), headers={"Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        assert c.get("/health").status_code == 200
    s = fresh_served(max_body_bytes=1 << 20, max_generate_body_bytes=2 << 20)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        r = c.post("/generate", content=_chunks(3 << 20), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "--max-generate-body-mb" in r.json()["error"]["message"], r.text
        r = c.post("/generate", json={"input_ids": [5] * 400_000, "sampling_params": GREEDY})  # 1.2 MB: by size ok
        assert r.status_code == 400 and "context" in r.json()["error"]["message"], r.text[:300]
        assert c.post("/generate", json={"input_ids": [5], "sampling_params": GREEDY}).status_code == 200


def test_tokenizing_runs_off_the_event_loop(fresh_served):
    s = fresh_served()
    srv = s.app.state.baton
    slow = srv.tokenizer = SlowTokenizer(srv.tokenizer)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        t = threading.Thread(target=lambda: c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2}))
        t.start()
        assert slow.entered.wait(30)
        try:
            r = httpx.get(s.url + "/health", timeout=5)  # the loop answers while a prompt is tokenized
            assert r.status_code == 200
        finally:
            slow.gate.set()
            t.join()


class _SteppingEngine(EmbeddedEngine):
    """A real engine whose decode steps are slowed (a long generation on a busy GPU)."""

    step_s = 0.02

    def generate(self, prompts, params, should_stop=None):
        def stop():
            time.sleep(self.step_s)
            return should_stop() if should_stop is not None else False
        return super().generate(prompts, params, stop)


@pytest.mark.parametrize("sliced", [False, True], ids=["one-call", "sliced"])
def test_health_tells_busy_from_wedged(fresh_served, srv_tokenizer, make_tiny_qwen, sliced):
    """A long generation run as one engine call, or in slices taking turns (running_s is
    then the generation's time, not one slice's)."""
    model = make_tiny_qwen(0)
    if sliced:  # the plain engine (sliced by the server), its decode steps slowed
        engine = EmbeddedEngine(model, srv_tokenizer)
        decode = engine.runner.decode
        engine.runner.decode = lambda tokens: (time.sleep(_SteppingEngine.step_s), decode(tokens))[1]
    else:
        engine = _SteppingEngine(model, srv_tokenizer)
    # wedged after 3 s of no decode step; the generation runs >= 250 x 0.02 = 5 s. A busy
    # machine can stall a step past 1 s (it did, once in a run beside a busy loop per core):
    # the margin is the deadline, not the machine's speed.
    s = fresh_served(engine=engine, model=model, wedged_after_s=3.0, slice_steps=8)
    with httpx.Client(base_url=s.url, timeout=60) as c:
        out = {}
        t = threading.Thread(target=lambda: out.update(r=c.post("/generate", json={
            "input_ids": [5], "sampling_params": {**GREEDY, "max_new_tokens": 250}})))
        t.start()
        seen = []
        while t.is_alive():
            r = c.get("/health")
            seen.append((r.status_code, r.json()["status"], r.json().get("busy", {}).get("running_s", 0)))
            time.sleep(0.05)
        t.join()
        assert out["r"].status_code == 200
        assert all(st == "ok" and code == 200 for code, st, _ in seen), seen  # never "wedged" while stepping
        assert max(run for *_, run in seen) > 3.0  # ... though the call ran past wedged_after_s
        assert c.get("/health").json().get("busy") is None


def test_admin_endpoints_refuse_what_a_web_page_can_send(fresh_served):
    s = fresh_served()
    srv = s.app.state.baton
    with httpx.Client(base_url=s.url, timeout=30) as c:
        r = c.post("/release_memory_occupation", content=b"x", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and "application/json" in r.text, r.text
        r = c.post("/release_memory_occupation", data={"a": "b"})  # a form post
        assert r.status_code == 415, r.text
        r = c.post("/release_memory_occupation", json={}, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403 and "Origin" in r.text, r.text
        assert not srv.asleep
        assert c.post("/release_memory_occupation", json={}).status_code == 200  # what baton's sync sends
        assert srv.asleep
        assert c.post("/resume_memory_occupation", json={}).status_code == 200


def test_openai_options_it_cannot_honour_are_refused(served):
    with httpx.Client(base_url=served.url, timeout=30) as c:
        for path, body in (("/v1/completions", {"prompt": [5, 6], "max_tokens": 2, "logprobs": 21}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                     "logprobs": True, "top_logprobs": 21}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                     "response_format": {"type": "xml"}})):
            r = c.post(path, json=body)
            assert r.status_code in (400, 422), (body, r.text)
        r = c.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2, "logprobs": 1})
        assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["top_logprobs"][0]) == 1
        r = c.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2, "model": "gpt-4"})
        assert r.status_code == 404 and "tiny-qwen" in r.json()["error"]["message"], r.text
        assert c.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2, "model": "tiny-qwen"}).status_code == 200
        assert c.get("/v1/models/tiny-qwen").json()["id"] == "tiny-qwen"
        r = c.get("/v1/models/gpt-4")
        assert r.status_code == 404 and "tiny-qwen" in r.json()["error"]["message"]


def test_request_log_lines_reach_stderr(fresh_served, capsys):
    """Without a caplog (as `baton serve` runs): the line is on stderr (the subprocess form:
    tests/rollout/test_serve_request_log.py)."""
    s = fresh_served(log_requests=True)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        assert c.post("/generate", json={"input_ids": [5], "sampling_params": GREEDY}).status_code == 200
    err = capsys.readouterr().err
    assert "baton.serve POST /generate 200 1+4 tokens" in err, err


def test_request_log_line(fresh_served, caplog):
    s = fresh_served(log_requests=True)
    with caplog.at_level(logging.INFO, logger="baton.serve"), httpx.Client(base_url=s.url, timeout=30) as c:
        assert c.post("/generate", json={"input_ids": [5], "sampling_params": GREEDY}).status_code == 200
        assert c.post("/generate", json={"input_ids": []}).status_code in (400, 422)
    lines = [r.getMessage() for r in caplog.records if r.name == "baton.serve"]
    assert any("POST /generate 200" in m and "tokens" in m for m in lines), lines
    assert any("POST /generate 4" in m for m in lines), lines
