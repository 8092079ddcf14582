"""`baton serve` cannot be misused: API key, admin switch, weights allow-list, checkpoint
checks, /health states, request bounds, cancellation of abandoned generations, and
malformed input answered with a 4xx (never a 500). Real HTTP against tiny models."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import torch

from baton.rollout.embedded.engine import EmbeddedEngine, GenerationCancelled
from baton.protocol import SamplingParams
from baton.rollout.server import build_app, parse_serve_args
from baton.sync import check_logprob_parity, save_safetensors_atomic

GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
KEY = "s3cret-key"
ADMIN = [("/update_weights_from_disk", {"model_path": "/x.safetensors"}),
         ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 29999, "rank_offset": 1,
                                         "world_size": 2}),
         ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]]}),
         ("/destroy_weights_update_group", {}),
         ("/release_memory_occupation", None),
         ("/resume_memory_occupation", None)]


def _gen(c: httpx.Client, **kw) -> httpx.Response:
    return c.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": {**GREEDY, **kw}})


# --- authentication ------------------------------------------------------------------------
def test_api_key(fresh_served):
    s = fresh_served(api_key=KEY, model_path="/models/tiny")
    with httpx.Client(base_url=s.url, timeout=60) as c:
        anon = c.get("/health")  # probes need no key, but learn no paths
        assert anon.status_code == 200 and anon.json()["status"] == "ok" and "model_path" not in anon.json()
        for headers, reason in [({}, "missing"), ({"Authorization": f"Bearer {KEY}x"}, "invalid"),
                                ({"Authorization": "Bearer"}, "malformed"), ({"Authorization": KEY}, "malformed"),
                                ({"Authorization": f"Basic {KEY}"}, "malformed")]:
            r = c.post("/generate", json={"input_ids": [5], "sampling_params": GREEDY}, headers=headers)
            assert r.status_code == 401 and reason in r.json()["error"]["message"], (headers, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
        for path in ("/v1/models", "/stats", "/get_model_info", "/openapi.json", "/docs"):
            assert c.get(path).status_code == 401, path
        # rejected before the body is even parsed, admin routes included
        assert c.post("/update_weights_from_disk", content=b"{garbage").status_code == 401
        assert c.post("/release_memory_occupation").status_code == 401
        assert s.engine.version == 0 and not s.app.state.baton.asleep

        c.headers["Authorization"] = f"Bearer {KEY}"
        assert _gen(c).status_code == 200
        assert c.get("/v1/models").status_code == 200
        assert c.get("/health").json()["model_path"] == "/models/tiny"
        c.headers["Authorization"] = f"bearer {KEY}"  # the scheme is case-insensitive (RFC 7235)
        assert _gen(c).status_code == 200


def test_no_api_key_means_open(served):
    with httpx.Client(base_url=served.url, timeout=60) as c:
        assert _gen(c, max_new_tokens=1).status_code == 200
        assert c.post("/generate", json={"input_ids": [5], "sampling_params": GREEDY},
                      headers={"Authorization": "Bearer whatever"}).status_code == 200
        assert "model_path" in c.get("/health").json()


def test_empty_api_key_refused(srv_tokenizer, make_tiny_qwen):
    with pytest.raises(ValueError, match="api_key"):
        build_app(EmbeddedEngine(make_tiny_qwen(0)), srv_tokenizer, "x", api_key="")


def test_cli_defaults(tmp_path):
    model = str(tmp_path)
    a = parse_serve_args([model], environ={})
    assert a.api_key is None and a.admin is True and a.weights_dirs == [tmp_path.resolve()]
    assert parse_serve_args([model], environ={"BATON_API_KEY": "k"}).api_key == "k"
    assert parse_serve_args([model, "--api-key", "flag"], environ={"BATON_API_KEY": "k"}).api_key == "flag"
    assert parse_serve_args([model, "--host", "0.0.0.0"], environ={}).admin is False  # network: off unless asked
    assert parse_serve_args([model, "--host", "0.0.0.0", "--admin"], environ={}).admin is True
    assert parse_serve_args([model, "--host", "::1"], environ={}).admin is True
    assert parse_serve_args([model, "--no-admin"], environ={}).admin is False
    b = parse_serve_args([model, "--weights-dir", str(tmp_path / "a"), "--weights-dir", str(tmp_path / "b/../c")],
                         environ={})
    assert b.weights_dirs == [tmp_path.resolve() / "a", tmp_path.resolve() / "c"]


# --- admin switch --------------------------------------------------------------------------
def test_admin_switch_off(fresh_served):
    s = fresh_served(admin=False)
    with httpx.Client(base_url=s.url, timeout=60) as c:
        for path, body in ADMIN:
            r = c.post(path, json=body) if body is not None else c.post(path)
            assert r.status_code == 403 and "--admin" in r.json()["error"]["message"], (path, r.text)
        assert _gen(c).status_code == 200  # generation is unaffected
        assert c.get("/health").json()["status"] == "ok"
    assert s.engine.version == 0 and not s.app.state.baton.receiver.groups


# --- weights from disk ---------------------------------------------------------------------
@pytest.fixture
def dirs(tmp_path, make_tiny_qwen):
    """allowed/ (the allow-list), outside/, and seed-1 weights saved in both."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    trainer = make_tiny_qwen(1)
    for d in (allowed, outside):
        save_safetensors_atomic(trainer.named_parameters(), d / "w.safetensors")
    return allowed, outside, trainer


def test_weights_allow_list(fresh_served, dirs):
    allowed, outside, trainer = dirs
    s = fresh_served(weights_dirs=[str(allowed)])
    (allowed / "escape.safetensors").symlink_to(outside / "w.safetensors")
    (allowed / "shards").mkdir()
    (allowed / "shards" / "model.safetensors").symlink_to(outside / "w.safetensors")
    (allowed / "link-dir").symlink_to(outside, target_is_directory=True)
    with httpx.Client(base_url=s.url, timeout=60) as c:
        for bad in (outside / "w.safetensors", allowed / ".." / "outside" / "w.safetensors",
                    allowed / "escape.safetensors", allowed / "shards", allowed / "link-dir", outside, "/etc/passwd"):
            r = c.post("/update_weights_from_disk", json={"model_path": str(bad)})
            assert r.status_code == 403 and r.json()["success"] is False and "outside" in r.text, (bad, r.text)
        assert s.engine.version == 0
        assert check_logprob_parity(s.engine, trainer, [5, 9, 11]) > 1e-2  # nothing was loaded
        r = c.post("/update_weights_from_disk", json={"model_path": str(allowed / "w.safetensors"), "version": 2})
        assert r.status_code == 200 and r.json()["version"] == 2
        h = c.get("/health").json()
        assert h["version"] == 2 and h["weights_path"] == str((allowed / "w.safetensors").resolve())
    assert check_logprob_parity(s.engine, trainer, [5, 9, 11]) < 1e-4


def test_default_allow_list_is_the_model_dir(fresh_served, dirs):
    allowed, outside, _ = dirs
    s = fresh_served(model_path=str(allowed))  # as `baton serve MODEL_DIR` without --weights-dir
    with httpx.Client(base_url=s.url, timeout=60) as c:
        assert c.post("/update_weights_from_disk", json={"model_path": str(outside)}).status_code == 403
        assert c.post("/update_weights_from_disk", json={"model_path": str(allowed)}).status_code == 200


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _corrupt_copy(trainer, path, name, value):
    params = {n: p.detach().clone() for n, p in trainer.named_parameters()}
    params[name].view(-1)[3] = value
    return save_safetensors_atomic(params.items(), path)


@pytest.mark.parametrize("make_bad,needle", [
    (lambda t, d: _corrupt_copy(t, d / "nan.safetensors", "model.layers.1.mlp.up_proj.weight", float("nan")),
     "non-finite"),
    (lambda t, d: _corrupt_copy(t, d / "inf.safetensors", "model.embed_tokens.weight", float("-inf")), "non-finite"),
    # good tensors first, a bad name last: nothing may have been installed
    (lambda t, d: save_safetensors_atomic([*t.named_parameters(), ("zz.not.a.param", torch.zeros(2))],
                                          d / "unknown.safetensors"), "unknown parameter"),
    (lambda t, d: save_safetensors_atomic({**dict(t.named_parameters()), "model.norm.weight": torch.ones(3)}.items(),
                                          d / "shape.safetensors"), "shape"),
    (lambda t, d: _write(d / "junk.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00not json"), "safetensors"),
    (lambda t, d: _write(d / "w.bin", b"a pickle"), ".safetensors"),
    (lambda t, d: (d / "empty").mkdir() or d / "empty", "no *.safetensors"),
    (lambda t, d: d / "missing.safetensors", "not found"),
])
def test_bad_checkpoint_rejected_old_weights_serve(fresh_served, dirs, make_tiny_qwen, make_bad, needle):
    allowed, _, trainer = dirs
    s = fresh_served(weights_dirs=[str(allowed)])
    original = make_tiny_qwen(0)
    prompt = [5, 9, 11, 4]
    bad = make_bad(trainer, allowed)
    with httpx.Client(base_url=s.url, timeout=60) as c:
        before = c.post("/generate", json={"input_ids": prompt, "sampling_params": GREEDY,
                                           "return_logprob": True}).json()
        r = c.post("/update_weights_from_disk", json={"model_path": str(bad), "version": 9})
        assert r.status_code == 400 and r.json()["success"] is False and needle in r.json()["message"], r.text
        h = c.get("/health")
        assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["version"] == 0
        after = c.post("/generate", json={"input_ids": prompt, "sampling_params": GREEDY,
                                          "return_logprob": True}).json()
    assert after == {**before, "meta_info": {**before["meta_info"], "id": after["meta_info"]["id"]}}
    assert check_logprob_parity(s.engine, original, prompt) < 1e-6  # every tensor is the old one


# --- /health states ------------------------------------------------------------------------
class GatedEngine(EmbeddedEngine):
    """generate / update_weights wait for `gate` (to hold the server in a state)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = threading.Event()

    def generate(self, prompts, params, should_stop=None):
        self.gate.wait(30)
        return super().generate(prompts, params, should_stop)

    def update_weights(self, weights, version):
        self.gate.wait(30)
        super().update_weights(weights, version)


def _wait_health(c: httpx.Client, status: str, timeout: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        r = c.get("/health")
        if r.json()["status"] == status or time.monotonic() > deadline:
            return r
        time.sleep(0.02)


def test_health_states(fresh_served, srv_tokenizer, make_tiny_qwen, dirs):
    allowed, _, _ = dirs
    model = make_tiny_qwen(0)
    engine = GatedEngine(model, srv_tokenizer)
    engine.gate.set()
    s = fresh_served(engine=engine, model=model, weights_dirs=[str(allowed)],
                     model_path=str(allowed))
    with httpx.Client(base_url=s.url, timeout=30) as c:
        r = c.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["version"] == 0
        assert r.json()["model_path"] == str(allowed)

        assert c.post("/release_memory_occupation", json={}).status_code == 200
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "sleeping" and "resume" in r.json()["reason"]
        g = _gen(c)
        assert g.status_code == 503 and "asleep" in g.json()["error"]["message"]
        assert c.post("/resume_memory_occupation", json={}).status_code == 200
        assert c.get("/health").status_code == 200

        srv = s.app.state.baton
        srv.wedged_after_s = 60.0
        engine.gate.clear()  # an update that takes a while
        t = threading.Thread(target=lambda: httpx.post(s.url + "/update_weights_from_disk", timeout=30,
                                                       json={"model_path": str(allowed), "version": 4}))
        t.start()
        r = _wait_health(c, "updating")
        assert r.status_code == 503 and r.json()["status"] == "updating"
        engine.gate.set()
        t.join()
        r = c.get("/health")
        assert r.status_code == 200 and r.json()["version"] == 4

        srv.wedged_after_s = 0.3
        engine.gate.clear()  # a generate stuck past the deadline
        t = threading.Thread(target=lambda: httpx.post(s.url + "/generate", timeout=30,
                                                       json={"input_ids": [5], "sampling_params": GREEDY}))
        t.start()
        r = _wait_health(c, "wedged")
        assert r.status_code == 503 and r.json()["status"] == "wedged" and "generate" in r.json()["reason"]
        engine.gate.set()
        t.join()
        assert c.get("/health").status_code == 200


# --- bounds --------------------------------------------------------------------------------
@pytest.mark.parametrize("path,body,needle", [
    ("/generate", {"input_ids": [5] * 250, "sampling_params": {"max_new_tokens": 7}}, "context of 256"),
    ("/generate", {"input_ids": [5] * 200_000, "sampling_params": {"max_new_tokens": 1}}, "context"),
    ("/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": 10**9}}, "context"),
    ("/v1/completions", {"prompt": [5, 6], "max_tokens": 1e9}, "context"),
    ("/v1/completions", {"prompt": "x" * 300, "max_tokens": 1}, "context"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 255}, "context"),
])
def test_context_overflow(served, path, body, needle):
    with httpx.Client(base_url=served.url, timeout=30) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_context_limit_is_inclusive_and_chat_default_fits(served):
    with httpx.Client(base_url=served.url, timeout=30) as c:
        r = c.post("/generate", json={"input_ids": [5] * 250, "sampling_params": {**GREEDY, "max_new_tokens": 6}})
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 6
        # no max_tokens: the default (256) is shortened to what the context has room for
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 200}],
                                                 "ignore_eos": True, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == 256


def test_token_caps(fresh_served, srv_tokenizer, make_tiny_qwen):
    model = make_tiny_qwen(0)
    s = fresh_served(engine=EmbeddedEngine(model, srv_tokenizer, max_batch_tokens=120), model=model,
                     max_request_tokens=64)
    with httpx.Client(base_url=s.url, timeout=30) as c:
        r = _gen(c, n=8, max_new_tokens=10)  # 80 generated tokens > 64
        assert r.status_code == 400 and "max-request-tokens" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"prompt": [5], "max_tokens": 65, "n": 1})
        assert r.status_code == 400 and "65" in r.json()["error"]["message"]
        assert _gen(c, n=4, max_new_tokens=16).status_code == 200  # 64: at the cap
        sp = {**GREEDY, "n": 4, "max_new_tokens": 2}
        r = c.post("/generate", json={"input_ids": [5] * 30, "sampling_params": sp})
        assert r.status_code == 400 and "max-batch-tokens" in r.json()["error"]["message"]  # 4 x 32 KV tokens > 120


def test_default_cap_is_sane(served):
    app_state = served.app.state.baton
    assert app_state.max_request_tokens == 65536 and app_state.context_len == 256


# --- cancellation --------------------------------------------------------------------------
class SlowDecode(EmbeddedEngine):
    """Every decode step takes >= step_s, so a long generation is long in wall time;
    `generate` first waits for `gate` (open by default)."""
    step_s = 0.05

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = threading.Event()
        self.gate.set()
        decode = self.runner.decode
        self.runner.decode = lambda tokens: (time.sleep(self.step_s), decode(tokens))[1]

    def generate(self, prompts, params, should_stop=None):
        self.gate.wait(30)
        return super().generate(prompts, params, should_stop)


async def _until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def _engine_free_within(srv, seconds: float) -> float | None:
    """Seconds until no engine call runs, or None if it still runs after `seconds`."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if srv.runner.current is None:
            return time.monotonic() - start
        await asyncio.sleep(0.01)
    return None


def test_engine_should_stop_hook(make_tiny_qwen):
    engine = EmbeddedEngine(make_tiny_qwen(0), max_batch_tokens=40)  # 3 prompts x 20 tokens: 2+ groups
    params = SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True)
    calls = []

    def stop_after(k):
        return lambda: calls.append(1) or len(calls) > k

    ref = engine.generate([[5], [6, 7], [8, 9, 10]], params)
    assert engine.generate([[5], [6, 7], [8, 9, 10]], params, should_stop=lambda: False) == ref
    for k in (0, 1, 5, 20):
        calls.clear()
        with pytest.raises(GenerationCancelled):
            engine.generate([[5], [6, 7], [8, 9, 10]], params, should_stop=stop_after(k))
        assert len(calls) == k + 1  # stops at the first True, no step later
    assert engine.generate([[5], [6, 7], [8, 9, 10]], params) == ref  # nothing left behind


def test_disconnected_client_generation_is_cancelled(fresh_served, srv_tokenizer, make_tiny_qwen):
    model = make_tiny_qwen(0)
    s = fresh_served(engine=SlowDecode(model, srv_tokenizer), model=model, max_batch_wait_ms=0)
    srv = s.app.state.baton
    body = {"input_ids": [5, 6], "sampling_params": {**GREEDY, "max_new_tokens": 240}}  # >= 12 s uncancelled

    async def run() -> float | None:
        async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:
            task = asyncio.ensure_future(c.post("/generate", json=body))
            await _until(lambda: srv.runner.current is not None)  # generating
            await asyncio.sleep(0.2)
            task.cancel()  # the client goes away: its connection closes
            with pytest.raises(asyncio.CancelledError):
                await task
        return await _engine_free_within(srv, 6.0)

    freed = asyncio.run(run())
    assert freed is not None, "the abandoned generation kept the engine busy"
    with httpx.Client(base_url=s.url, timeout=30) as c:
        r = c.post("/generate", json={"input_ids": [7], "sampling_params": {**GREEDY, "max_new_tokens": 3}})
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 3
    assert s.stats()["cancelled"] == 1


def test_batch_survives_while_one_client_waits(fresh_served, srv_tokenizer, make_tiny_qwen):
    model = make_tiny_qwen(0)
    engine = SlowDecode(model, srv_tokenizer)
    engine.step_s = 0.02
    s = fresh_served(engine=engine, model=model, max_batch_wait_ms=0)
    srv = s.app.state.baton
    body = {"input_ids": [5, 6], "sampling_params": {**GREEDY, "max_new_tokens": 40}}

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:
            engine.gate.clear()  # a first request holds the engine while the next two queue together
            blocker = asyncio.ensure_future(c.post("/generate", json={"input_ids": [9], "sampling_params": GREEDY}))
            await _until(lambda: srv.runner.current is not None)
            patient = asyncio.ensure_future(c.post("/generate", json=body))
            impatient = asyncio.ensure_future(c.post("/generate", json=body))
            await _until(lambda: s.stats()["requests"] == 3)
            engine.gate.set()
            await _until(lambda: s.stats()["batches"] == 2)  # the shared batch is running
            impatient.cancel()
            assert (await blocker).status_code == 200
            return await patient

    r = asyncio.run(run())
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 40
    st = s.stats()
    assert st["batches"] == 2 and st["max_batch_requests"] == 2 and st["dropped"] == 0 and st["cancelled"] == 0


def test_engine_without_hook_still_served(fresh_served, srv_tokenizer, make_tiny_qwen):
    class Plain(EmbeddedEngine):  # an Engine whose generate takes no should_stop
        def generate(self, prompts, params):
            return super().generate(prompts, params)

    model = make_tiny_qwen(0)
    s = fresh_served(engine=Plain(model, srv_tokenizer), model=model)
    assert not s.app.state.baton.runner.cancellable
    with httpx.Client(base_url=s.url, timeout=60) as c:
        assert _gen(c).status_code == 200


# --- malformed input -----------------------------------------------------------------------
SP = '"sampling_params": {"max_new_tokens": 2'


@pytest.mark.parametrize("path,raw,needle", [
    ("/generate", '{"text": "a\\ud800b", ' + SP + '}}', "surrogate"),
    ("/v1/completions", '{"prompt": "a\\udc00", "max_tokens": 2}', "surrogate"),
    ("/v1/completions", '{"prompt": ["ok", "\\udfff"], "max_tokens": 2}', "surrogate"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud83d"}]}', "surrogate"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "stop": ["\\ud800"]}}', "surrogate"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "temperature": NaN}}', "NaN"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "top_p": Infinity}}', "Infinity"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "min_p": -Infinity}}', "Infinity"),
    ("/v1/completions", '{"prompt": "1", "max_tokens": 2, "temperature": 1e999}', "overflows"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": '
                             '{"a": NaN}}', "NaN"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "temperature": 1e-300}}', "temperature"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "seed": 18446744073709551616}}', "seed"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "sampling_seed": -9223372036854775809}}', "sampling_seed"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "stop_token_ids": [9223372036854775808]}}', "stop_token_ids"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "stop_token_ids": [-5]}}', "stop_token_ids"),
    ("/generate", '{"input_ids": [9223372036854775808]}', "outside"),
    ("/generate", '{"input_ids": [-1, 5]}', "outside"),
    ("/generate", '{"input_ids": [5], ' + SP + ', "n": 0}}', '"param":"sampling_params.n"'),
    ("/generate", '{"input_ids": [5], ' + SP + ', "n": 100000}}', '"param":"sampling_params.n"'),
    ("/v1/completions", '{"prompt": "1", "max_tokens": -1}', "max_tokens"),
    ("/v1/completions", '{"prompt": "1", "max_tokens": 2, "logprobs": 100}', "logprobs"),
    ("/generate", '{"input_ids": [' + "1" * 5000 + ']}', "integer"),
    ("/generate", "[" * 100_000 + "]" * 100_000, "nested"),
    ("/update_weights_from_disk", '{"model_path": "/nonexistent.safetensors", "version": 9223372036854775808}',
     "version"),
    ("/update_weights_from_disk", '{"model_path": "/nonexistent.safetensors", "weight_version": "-3"}',
     "weight_version"),
    ("/update_weights_from_disk", '{"model_path": "\\ud800"}', "surrogate"),
    ("/update_weights_from_disk", '{"model_path": ""}', "model_path"),
    ("/init_weights_update_group", '{"master_address": "127.0.0.1", "master_port": 29999, "rank_offset": 1, '
                                   '"world_size": 2, "timeout_s": 1e300}', "timeout_s"),
    ("/init_weights_update_group", '{"master_address": "127.0.0.1", "master_port": 29999, "rank_offset": 5, '
                                   '"world_size": 2}', "rank_offset"),
    ("/update_weights_from_distributed", '{"names": ["a"], "dtypes": ["float32"], "shapes": [[1]], '
                                         '"bucket_bytes": 1e300}', "bucket_bytes"),
])
def test_malformed_input_is_4xx(served, path, raw, needle):
    with httpx.Client(base_url=served.url, timeout=30) as c:
        r = c.post(path, content=raw.encode("utf-8"), headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500 and needle in r.text, (r.status_code, r.text[:300])
        assert c.get("/health").json()["status"] == "ok"


def test_invalid_utf8_body(served):
    with httpx.Client(base_url=served.url, timeout=60) as c:
        r = c.post("/generate", content=b'{"text": "\xff\xfe"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]


def test_openapi_documents_errors(fresh_served):
    s = fresh_served(api_key=KEY)
    with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        spec = c.get("/openapi.json").json()["paths"]
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        assert {"400", "401", "422"} <= set(spec[path]["post"]["responses"]), path
    for path, _ in ADMIN:
        assert {"400", "401", "403"} <= set(spec[path]["post"]["responses"]), path
    assert "503" in spec["/health"]["get"]["responses"]

