"""`baton tinker` over plain HTTP (no SDK; the default suite runs these): the session / model /
future flow in the JSON form, the loss numbers against baton's own loss code, the protobuf
messages, and the refusals (unsupported features, malformed requests, a missing key)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from baton.tinker import wire
from tests.tinker_api.conftest import KEY, NAME, golden_rows

H = {"X-API-Key": KEY}


def post(server, path, body, **kw):
    return httpx.post(f"{server.url}/api/v1/{path}", json=body, headers=H, timeout=60, **kw)


def result(server, reply):
    assert reply.status_code == 200, reply.text
    request_id = reply.json()["request_id"]
    for _ in range(60):
        out = post(server, "retrieve_future", {"request_id": request_id})
        assert out.status_code == 200, out.text
        if out.json().get("type") != "try_again":
            return out.json()
    raise AssertionError("future never finished")


def tensor(values, dtype):
    a = np.asarray(values, dtype=dtype)
    return {"data": a.tolist(), "dtype": dtype, "shape": list(a.shape)}


@pytest.fixture(scope="module")
def model_id(server):
    session = post(server, "create_session", {}).json()["session_id"]
    reply = post(server, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": NAME,
                                          "lora_config": {"rank": 4, "seed": 0}})
    return result(server, reply)["model_id"]


def fwd(server, model_id, rows, loss_fn, forward_only=True, config=None):
    data = [{"model_input": {"chunks": [{"tokens": t}]},
             "loss_fn_inputs": {"target_tokens": tensor(tg, "int64"), "logprobs": tensor(old, "float32"),
                                "advantages": tensor(adv, "float32")}} for t, tg, old, adv in rows]
    body = {"model_id": model_id, "forward_only": forward_only,
            "forward_backward_input": {"data": data, "loss_fn": loss_fn, "loss_fn_config": config}}
    return post(server, "forward_backward", body)


def test_losses_equal_baton_policy_losses(server, model_id, tiny_dir):
    rows, expect = golden_rows(tiny_dir)
    for loss_fn in ("ppo", "importance_sampling"):
        out = result(server, fwd(server, model_id, rows, loss_fn))
        assert out["metrics"]["loss:sum"] == pytest.approx(expect[loss_fn], rel=1e-5, abs=1e-5)
        assert [o["logprobs"]["shape"] for o in out["loss_fn_outputs"]] == [[9], [6]]


def test_health_capabilities_and_key(server):
    assert httpx.get(f"{server.url}/api/v1/healthz").json() == {"status": "ok"}  # no key needed
    denied = httpx.get(f"{server.url}/api/v1/get_server_capabilities")
    assert denied.status_code == 401 and "X-API-Key" in denied.json()["detail"]
    wrong = httpx.get(f"{server.url}/api/v1/get_server_capabilities", headers={"X-API-Key": "tml-wrong"})
    assert wrong.status_code == 401
    caps = httpx.get(f"{server.url}/api/v1/get_server_capabilities", headers=H).json()
    assert caps["supported_models"][0]["model_name"] == NAME


def test_unsupported_and_malformed(server, model_id):
    rows = [([5, 6, 7], [6, 7, 8], [-1.0] * 3, [1.0] * 3)]
    refused = fwd(server, model_id, rows, "dro")
    assert refused.status_code == 400 and "loss_fn 'dro' is not served" in refused.json()["detail"]
    custom = post(server, "create_custom_loss", {})
    assert custom.status_code == 404 and "server-side custom losses" in custom.json()["detail"]
    short = fwd(server, model_id, [([5, 6, 7], [6, 7], [-1.0] * 2, [1.0] * 2)], "ppo")
    assert short.status_code == 400 and "needs [3]" in short.json()["detail"]
    bad_key = fwd(server, model_id, rows, "ppo", config={"clip_ratio": 0.3})
    assert bad_key.status_code == 400 and "'clip_ratio'" in bad_key.json()["detail"]
    garbage = httpx.post(f"{server.url}/api/v1/forward_backward", content=b"\x0a\xff\xff",
                         headers={**H, "Content-Type": "application/x-protobuf"})
    assert garbage.status_code == 400 and "malformed forward_backward" in garbage.json()["detail"]
    missing = post(server, "optim_step", {"model_id": "nope:train:0", "adam_params": {"learning_rate": 1e-3}})
    assert missing.status_code == 404
    typed = post(server, "optim_step", {"model_id": model_id, "adam_params": {"learning_rate": "fast"}})
    assert typed.status_code == 422 and "learning_rate" in typed.json()["detail"]
    unknown = post(server, "retrieve_future", {"request_id": "no-such"})
    assert unknown.status_code == 404


def test_train_then_sample_over_http(server, model_id):
    """cross_entropy on one fixed row: the loss falls over a few AdamW steps, and a sampler
    snapshot samples from the new weights (its logprobs are the trained model's)."""
    tokens = [10, 11, 12, 13, 14, 15, 16]
    row = {"model_input": {"chunks": [{"tokens": tokens[:-1]}]},
           "loss_fn_inputs": {"target_tokens": tensor(tokens[1:], "int64"), "weights": tensor([1.0] * 6, "float32")}}
    body = {"model_id": model_id, "forward_backward_input": {"data": [row], "loss_fn": "cross_entropy"}}
    losses = []
    for _ in range(4):
        losses.append(result(server, post(server, "forward_backward", body))["metrics"]["loss:sum"])
        step = result(server, post(server, "optim_step", {"model_id": model_id, "adam_params": {"learning_rate": 3e-3}}))
        assert step["metrics"]["optim/grad_norm"] > 0
    assert losses[-1] < losses[0] - 1.0, losses
    saved = result(server, post(server, "save_weights_for_sampler", {"model_id": model_id}))
    sampler = saved["sampling_session_id"]
    sample = {"sampling_session_id": sampler, "num_samples": 1, "prompt": {"chunks": [{"tokens": tokens[:-1]}]},
              "sampling_params": {"max_tokens": 1, "temperature": 1.0}, "prompt_logprobs": True}
    out = result(server, post(server, "asample", sample))
    trained = result(server, post(server, "forward_backward", {**body, "forward_only": True}))
    lp = trained["loss_fn_outputs"][0]["logprobs"]["data"]
    assert out["prompt_logprobs"][1:] == pytest.approx(lp[:-1], abs=1e-4)  # the sampler runs the new weights


def test_wire_roundtrip():
    """Our encoder's ForwardBackwardOutput and a hand-built request parse back as written."""
    datum = (wire.put_bytes(1, wire.put_bytes(1, wire.put_bytes(1, np.array([4, 5], np.int32).tobytes())))
             + wire.put_bytes(2, wire.put_bytes(1, b"target_tokens") + wire.put_bytes(
                 2, wire.put_bytes(1, np.array([5, 6], np.int64).tobytes()) + wire.put_int(3, 2) + wire.put_bytes(
                     4, bytes([2])))))
    req = (wire.put_bytes(1, b"m:train:0") + wire.put_int(2, 3) + wire.put_bytes(3, datum) + wire.put_bytes(4, b"ppo")
           + wire.put_bytes(5, wire.put_bytes(1, b"clip_low_threshold") + wire.put_double(2, 0.7)))
    parsed = wire.forward_backward_request(req)
    assert (parsed.model_id, parsed.seq_id, parsed.loss_fn, parsed.config) == ("m:train:0", 3, "ppo",
                                                                                 {"clip_low_threshold": 0.7})
    assert parsed.data[0].tokens == [4, 5] and parsed.data[0].inputs["target_tokens"].tolist() == [5, 6]
    with pytest.raises(wire.WireError):
        wire.forward_backward_request(req[:-3])


def test_cli_refuses_bad_options(tmp_path, capsys):
    from baton.cli import main

    for argv in ([str(tmp_path / "missing")], [str(tmp_path), "--max-models", "0"], [str(tmp_path), "--api-key", ""]):
        with pytest.raises(SystemExit) as exit_:
            main(["tinker", *argv])
        assert exit_.value.code == 2
        assert "baton tinker: error:" in capsys.readouterr().err


def test_finish_session_ends_the_sdks_close(server):
    """`ServiceClient.close(status)` (the cookbook's sl_basic / rl_basic end with it) posts
    /sessions/{id}/finish: a known session is acknowledged, an unknown one is a 404."""
    session = post(server, "create_session", {}).json()["session_id"]
    body = {"reason": {"type": "success"}, "detail": None}
    assert post(server, f"sessions/{session}/finish", body).status_code == 200
    unknown = post(server, "sessions/session-nope/finish", body)
    assert unknown.status_code == 404 and "unknown session_id" in unknown.json()["detail"]
    assert post(server, f"sessions/{session}/finish", {"detail": "x"}).status_code == 422  # no reason
