"""`baton serve` interleaves generations (issue 22 §2): a short request completes while a long
one is still generating, both get the tokens they would get alone, and /health says busy
(not wedged) while they step. Real HTTP on 127.0.0.1 against a tiny Qwen2 with a context
long enough for a long generation; the order of events is fixed by gating decode steps,
never by wall-clock races. (/health during sliced generations: test_server_hostile.py.)"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from baton.models.tiny import build_tiny_model
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams

LONG = 400  # tokens of the long generation
SHORT = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
LONG_SP = {"temperature": 1.0, "max_new_tokens": LONG, "ignore_eos": True, "seed": 7}


@pytest.fixture
def long_engine(srv_tokenizer):
    model = build_tiny_model(None, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, seed=0,
                             max_position=1024).eval()
    return model, EmbeddedEngine(model, srv_tokenizer)


def _gate_long_steps(engine: EmbeddedEngine, gates: dict[int, threading.Event]) -> list[int]:
    """Counts the decode steps of generations longer than LONG // 2 tokens (the long one: its
    KV cache is that long) and, at step k, waits for gates[k]. Returns the live counter."""
    count = [0]
    decode = engine.runner.decode

    def gated(tokens):
        if engine.runner.cache[0][0].shape[2] > LONG // 2:
            count[0] += 1
            if count[0] in gates:
                gates[count[0]].wait(20)
        return decode(tokens)

    engine.runner.decode = gated
    return count


def test_a_short_request_completes_while_a_long_one_runs(fresh_served, long_engine):
    model, engine = long_engine
    long_prompt, short_prompt = [5, 6, 7, 8], [9, 10, 11]
    ref_long = engine.generate([long_prompt], SamplingParams(**{**LONG_SP, "max_new_tokens": LONG}))[0]
    ref_short = engine.generate([short_prompt], SamplingParams(**SHORT))[0]
    short_queued, short_answered = threading.Event(), threading.Event()
    steps = _gate_long_steps(engine, {20: short_queued, 60: short_answered})
    s = fresh_served(engine=engine, model=model, slice_steps=8, max_batch_wait_ms=0)
    srv = s.app.state.baton
    out: dict[str, httpx.Response] = {}

    def post(name, prompt, sp):
        with httpx.Client(base_url=s.url, timeout=60) as c:
            out[name] = c.post("/generate", json={"input_ids": prompt, "sampling_params": sp,
                                                   "return_logprob": True})

    long_t = threading.Thread(target=post, args=("long", long_prompt, LONG_SP))
    long_t.start()
    short_t = threading.Thread(target=post, args=("short", short_prompt, SHORT))
    try:
        deadline = time.monotonic() + 20
        while steps[0] < 20 and time.monotonic() < deadline:  # the long one reached its gate
            time.sleep(0.01)
        short_t.start()
        while srv.batcher.queued == 0 and time.monotonic() < deadline:  # the short one is queued
            time.sleep(0.01)
        short_queued.set()
        short_t.join(15)  # the long generation is held at step 60 until the short one is answered
        answered_at = steps[0]
        assert not short_t.is_alive(), "the short request waited for the long one"
        assert answered_at < 60 and long_t.is_alive(), answered_at
        health = httpx.get(s.url + "/health", timeout=10).json()  # the long one is still generating
        assert health["status"] == "ok" and health["busy"]["running_requests"] == 1, health
    finally:
        short_queued.set()
        short_answered.set()
        if short_t.ident is not None:
            short_t.join(30)
        long_t.join(60)
    assert out["long"].status_code == 200 and out["short"].status_code == 200
    long_body, short_body = out["long"].json(), out["short"].json()
    assert long_body["output_ids"] == ref_long.token_ids  # seeded, T=1: the same tokens as alone
    assert [lp for lp, _, _ in long_body["meta_info"]["output_token_logprobs"]] == ref_long.logprobs
    assert short_body["output_ids"] == ref_short.token_ids  # greedy: the same as alone
    st = s.stats()
    assert st["batches"] == 2 and st["slices"] > LONG // 8 and st["max_running"] == 2, st


@pytest.mark.parametrize("fast", [True, False], ids=["llama-runner", "hf-runner"])
def test_sliced_generations_match_alone_greedy_and_seeded(fresh_served, long_engine, srv_tokenizer, fast):
    """Several generations of different lengths and settings, all taking turns (on the fast
    Llama / Qwen2 runner and on HF's own forward with its DynamicCache)."""
    import asyncio

    model, _ = long_engine
    engine = EmbeddedEngine(model, srv_tokenizer, fast=fast)
    reqs = [([5, 6], {"temperature": 0, "max_new_tokens": 90, "ignore_eos": True}),
            ([7], {"temperature": 1.0, "max_new_tokens": 33, "ignore_eos": True, "seed": 3, "n": 2}),
            ([8, 9, 10], {"temperature": 0.7, "max_new_tokens": 5, "ignore_eos": True, "seed": 4}),
            ([11, 12], {"temperature": 0, "max_new_tokens": 61, "ignore_eos": True})]
    refs = [[c.token_ids for c in engine.generate([p], SamplingParams(**sp))] for p, sp in reqs]
    s = fresh_served(engine=engine, model=model, slice_steps=4, max_batch_wait_ms=0)

    async def run():
        async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:
            rs = await asyncio.gather(*[c.post("/generate", json={"input_ids": p, "sampling_params": sp})
                                        for p, sp in reqs])
        return [r.json() for r in rs]

    outs = asyncio.run(run())
    got = [[o["output_ids"] for o in (out if isinstance(out, list) else [out])] for out in outs]
    assert got == refs
    assert s.stats()["slices"] > 90 // 4


def test_a_weight_update_waits_for_running_generations(fresh_served, long_engine, tmp_path, make_tiny_qwen):
    """A generation never mixes two versions of the weights: an update that arrives while
    one runs waits for it (and starts no new one meanwhile)."""
    model, engine = long_engine
    ref = engine.generate([[5, 6, 7, 8]], SamplingParams(**LONG_SP))[0]
    ckpt = tmp_path / "v1"
    make_tiny_qwen(1).save_pretrained(ckpt)
    update_waiting = threading.Event()
    steps = _gate_long_steps(engine, {20: update_waiting})
    s = fresh_served(engine=engine, model=model, slice_steps=8, max_batch_wait_ms=0)
    srv = s.app.state.baton
    out: dict[str, httpx.Response] = {}

    def post(name, path, body):
        out[name] = httpx.post(s.url + path, json=body, timeout=60)

    gen = threading.Thread(target=post, args=("long", "/generate", {"input_ids": [5, 6, 7, 8], "sampling_params": LONG_SP}))
    upd = threading.Thread(target=post, args=("update", "/update_weights_from_disk",
                                              {"model_path": str(ckpt), "version": 1}))
    gen.start()
    try:
        deadline = time.monotonic() + 20
        while steps[0] < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        upd.start()
        while srv.updating == 0 and time.monotonic() < deadline:  # the update waits for the generation
            time.sleep(0.01)
        assert srv.updating == 1 and engine.version == 0
    finally:
        update_waiting.set()
        gen.join(60)
        if upd.ident is not None:
            upd.join(60)
    body = out["long"].json()
    assert body["output_ids"] == ref.token_ids and body["meta_info"]["weight_version"] == 0
    assert out["update"].status_code == 200 and out["update"].json()["version"] == 1 and engine.version == 1


def test_bad_slice_settings_are_refused():
    from baton.rollout.server import parse_serve_args

    with pytest.raises(SystemExit) as e:
        parse_serve_args(["/tmp", "--slice-steps", "-1"])
    assert e.value.code == 2
