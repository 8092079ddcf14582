"""`baton serve` under load (issue 38 §10): a bounded queue of requests waiting for the
engine (429 + Retry-After past --max-queued-requests) and /health answered while the engine
is held and the queue is full. Real uvicorn on loopback, a real tiny model; the engine is
held by an Event the test controls (`GatedEngine`), so nothing races a clock."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from baton.rollout.remote import RemoteEngine
from baton.protocol import SamplingParams
from baton.rollout.server import parse_serve_args
from tests.rollout.test_server_guards import GatedEngine

GREEDY = {"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}


def _until(cond, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s  # only stops a broken run from hanging
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _gen(url: str, seed: int) -> httpx.Response:  # seeded requests never share a generation
    return httpx.post(f"{url}/generate", timeout=120,
                      json={"input_ids": [5, 6, 7], "sampling_params": {**GREEDY, "seed": seed}})


def test_a_full_queue_is_429_with_retry_after_and_health_answers(fresh_served, srv_tokenizer, make_tiny_qwen):
    model = make_tiny_qwen(0)
    engine = GatedEngine(model, srv_tokenizer)  # generate waits for engine.gate
    s = fresh_served(engine=engine, model=model, max_queued_requests=3, max_batch_wait_ms=0)
    srv = s.app.state.baton
    with ThreadPoolExecutor(4) as pool:
        held = [pool.submit(_gen, s.url, 0)]
        _until(lambda: srv.batcher.running == 1, "the first generation holds the engine")
        held += [pool.submit(_gen, s.url, seed) for seed in (1, 2, 3)]
        _until(lambda: srv.wait_queue.waiting() == 3, "three requests waiting")
        r = _gen(s.url, 9)  # the queue is full
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert err["code"] == "queue_full" and "--max-queued-requests 3" in err["message"]
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "ab", "max_tokens": 2}, timeout=10)
        assert r.status_code == 429
        h = httpx.get(f"{s.url}/health", timeout=10)  # held until the test opens the gate: no race
        assert h.status_code == 200 and h.json()["busy"]["queued_requests"] == 3
        assert not any(f.done() for f in held)
        engine.gate.set()
        assert [f.result().status_code for f in held] == [200] * 4
    assert httpx.get(f"{s.url}/stats").json()["refused_busy"] == 2
    assert _gen(s.url, 10).status_code == 200  # room again


def test_remote_engine_waits_out_a_429(fresh_served, srv_tokenizer, make_tiny_qwen):
    model = make_tiny_qwen(0)
    engine = GatedEngine(model, srv_tokenizer)
    s = fresh_served(engine=engine, model=model, max_queued_requests=1, max_batch_wait_ms=0)
    srv = s.app.state.baton
    remote = RemoteEngine(s.url, timeout=120)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(_gen, s.url, 0)
        _until(lambda: srv.batcher.running == 1, "the first generation holds the engine")
        second = pool.submit(_gen, s.url, 1)
        _until(lambda: srv.wait_queue.waiting() == 1, "one request waiting")
        third = pool.submit(remote.generate, [[5, 6]], SamplingParams(temperature=0, max_new_tokens=2))
        _until(lambda: srv.wait_queue.refused >= 1, "the remote engine's request refused (429)")
        assert not third.done()  # it waits and retries instead of failing
        engine.gate.set()
        assert first.result().status_code == second.result().status_code == 200
        assert len(third.result()) == 1
    remote.close()


@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_queued_requests_below_one_is_refused(value, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["model", "--max-queued-requests", value])
    assert exc.value.code == 2 and "--max-queued-requests must be >= 1" in capsys.readouterr().err
