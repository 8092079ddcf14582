"""`baton tinker FILE.gguf`: the server converts the file once into a cached HF directory (as
`baton serve` does, `baton.models.resolve`), serves it under the file's name (and path), and
its logprobs are the original model's; a bad file is one line and exit 2, nothing cached.
The GGUF is written here by `baton export --gguf` from the tiny test model (no download)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from baton.cli import main  # noqa: E402
from baton.rollout.server import ServerThread  # noqa: E402
from baton.tinker.app import build_app, load_service, parse_args  # noqa: E402
from tests.tinker_api.conftest import KEY, base_logprobs  # noqa: E402
from tests.tinker_api.test_tinker_http import H, result, tensor  # noqa: E402


@pytest.fixture
def tiny_gguf(tiny_dir, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BATON_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "tiny-f32.gguf"
    assert main(["export", str(tiny_dir), str(out), "--gguf", "--gguf-type", "f32"]) == 0
    return out


def test_a_gguf_file_is_served_with_the_models_logprobs(tiny_gguf, tiny_dir, tmp_path):
    args = parse_args([str(tiny_gguf)])
    assert args.model_dir.is_dir() and args.model_dir.is_relative_to(tmp_path / "cache")
    service = load_service(args.model_dir, model_name=args.model_name, state_dir=tmp_path / "state",
                           aliases=args.aliases)
    server = ServerThread(build_app(service, api_key=KEY, poll_s=5.0))
    try:
        caps = httpx.get(f"{server.url}/api/v1/get_server_capabilities", headers=H).json()
        assert caps["supported_models"][0]["model_name"] == "tiny-f32"  # the file's name
        session = httpx.post(f"{server.url}/api/v1/create_session", json={}, headers=H).json()["session_id"]
        tokens, targets = [5, 17, 99, 3, 42, 8], [17, 99, 3, 42, 8, 61]
        want = base_logprobs(tiny_dir, tokens, targets)  # the original directory's model, fp32
        for seq, base_model in enumerate(("tiny-f32", str(tiny_gguf))):
            reply = httpx.post(f"{server.url}/api/v1/create_model", headers=H, timeout=60, json={
                "session_id": session, "model_seq_id": seq, "base_model": base_model, "lora_config": {"rank": 4}})
            model_id = result(server, reply)["model_id"]
            datum = {"model_input": {"chunks": [{"tokens": tokens}]},
                     "loss_fn_inputs": {"target_tokens": tensor(targets, "int64"),
                                        "weights": tensor(np.ones(len(targets)), "float32")}}
            reply = httpx.post(f"{server.url}/api/v1/forward_backward", headers=H, timeout=60, json={
                "model_id": model_id, "forward_only": True,
                "forward_backward_input": {"data": [datum], "loss_fn": "cross_entropy"}})
            got = torch.tensor(result(server, reply)["loss_fn_outputs"][0]["logprobs"]["data"])
            # f32 GGUF holds the same float32 weights: the same forward pass, bit for bit up to
            # the summation order of one matmul (a few ulps of logprobs ~ -5.5)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    finally:
        server.stop()


def test_a_bad_gguf_is_one_line_and_exit_2_with_nothing_cached(tiny_gguf, tmp_path, capsys):
    half = tmp_path / "half.gguf"
    data = tiny_gguf.read_bytes()
    half.write_bytes(data[: len(data) // 2])
    for argv, says in ((["tinker", str(half)], "a truncated"),
                       (["tinker", str(tmp_path / "none.gguf")], "no such file")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())
