"""Verified weight versions (issue 49): the checkpoint transport sends a digest per tensor of
what it wrote; `baton serve` checks every tensor it read against it before installing, and
refuses a mismatch (409, one line naming the tensor) keeping its old version serving. The
corruption is injected for real between the write and the load (a flipped byte of a tensor's
data, which every earlier check let through; a file cut short of a tensor)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import httpx
import pytest
import torch

from baton.rollout.remote import RemoteEngine, RemoteEngineError
from baton.sync import check_logprob_parity
from baton.sync.checkpoint import CheckpointSync, iter_safetensors, save_safetensors_atomic
from baton.sync.digest import WeightDigestError, check_digests, digests

PROMPT = [5, 9, 11, 4]
NAME = "model.norm.weight"


def flip_a_byte(path: Path) -> None:
    """XOR 1 into the lowest byte of `NAME`'s first element: a finite value, the right shape."""
    data = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", data[:8])[0]
    start = json.loads(data[8:8 + header_len])[NAME]["data_offsets"][0]
    data[8 + header_len + start] ^= 1
    path.write_bytes(bytes(data))


def drop_a_tensor(path: Path) -> None:
    """Rewrite the file without `NAME` (a transfer cut short of one tensor)."""
    save_safetensors_atomic([(n, t) for n, t in iter_safetensors(path) if n != NAME], path)


class Injected(RemoteEngine):
    """The real client of `baton serve`, with `fault` applied to the file before the load."""

    def __init__(self, url: str, fault):
        super().__init__(url)
        self.fault = fault

    def update_weights_from_disk(self, path, version, digests=None):
        if self.fault is not None:
            self.fault(Path(path))
        super().update_weights_from_disk(path, version, digests=digests)


@pytest.mark.parametrize("fault, needle", [
    (flip_a_byte, f"tensor {NAME!r}: digest "),
    (drop_a_tensor, f"tensor {NAME!r} was sent and did not arrive"),
])
def test_a_corrupted_push_is_refused_naming_the_tensor_and_the_old_version_serves(fresh_served, make_tiny_qwen,
                                                                                  tmp_path, fault, needle):
    s = fresh_served(weights_dirs=[str(tmp_path)])
    original, trainer = make_tiny_qwen(0), make_tiny_qwen(1)
    with httpx.Client(base_url=s.url, timeout=60) as c:
        before = c.post("/generate", json={"input_ids": PROMPT, "sampling_params": {"temperature": 0,
                                                                                     "max_new_tokens": 4}}).json()
        sync = CheckpointSync([Injected(s.url, fault)], directory=tmp_path)
        with pytest.raises(RemoteEngineError) as err:
            sync.push(trainer.named_parameters(), 1)
        line = str(err.value)
        assert "\n" not in line
        assert needle in line and "still serving version 0" in line, line
        h = c.get("/health").json()
        assert h["status"] == "ok" and h["version"] == 0
        after = c.post("/generate", json={"input_ids": PROMPT, "sampling_params": {"temperature": 0,
                                                                                    "max_new_tokens": 4}}).json()
        assert after == {**before, "meta_info": {**before["meta_info"], "id": after["meta_info"]["id"]}}
        assert check_logprob_parity(s.engine, original, PROMPT) < 1e-6  # every tensor is the old one
        CheckpointSync([Injected(s.url, None)], directory=tmp_path).push(trainer.named_parameters(), 1)
        assert c.get("/health").json()["version"] == 1  # the same push, intact: installed
    assert check_logprob_parity(s.engine, trainer, PROMPT) < 1e-4


def test_digests_name_a_changed_missing_or_extra_tensor():
    sent = {"a": torch.arange(4.0), "b": torch.ones(2, 3)}
    d = digests(sent.items())
    assert check_digests(sent.items(), d) == 2
    with pytest.raises(WeightDigestError, match="tensor 'b': digest"):
        check_digests([("a", sent["a"]), ("b", sent["b"].double())], d)  # same values, other dtype
    with pytest.raises(WeightDigestError, match="tensor 'b' was sent and did not arrive"):
        check_digests([("a", sent["a"])], d)
    with pytest.raises(WeightDigestError, match="tensor 'c' was received but not sent"):
        check_digests([*sent.items(), ("c", torch.zeros(1))], d)


def test_an_in_process_engine_refuses_a_corrupted_file_and_keeps_its_version(make_tiny_qwen, srv_tokenizer,
                                                                             tmp_path, monkeypatch):
    """CheckpointSync into an engine in this process: the file it wrote is checked against
    what it sent before the engine installs it (the byte flipped right after the write)."""
    import baton.sync.checkpoint as checkpoint_module
    from baton.rollout.embedded import EmbeddedEngine

    original, trainer = make_tiny_qwen(0), make_tiny_qwen(1)
    engine = EmbeddedEngine(make_tiny_qwen(0), srv_tokenizer)
    write = checkpoint_module.save_safetensors_atomic

    def write_then_flip(named, path):
        out = write(named, path)
        flip_a_byte(out)
        return out
    monkeypatch.setattr(checkpoint_module, "save_safetensors_atomic", write_then_flip)
    with pytest.raises(WeightDigestError, match=f"tensor {NAME!r}: digest "):
        CheckpointSync([engine], directory=tmp_path).push(trainer.named_parameters(), 1)
    assert engine.version == 0 and check_logprob_parity(engine, original, PROMPT) < 1e-6
    monkeypatch.setattr(checkpoint_module, "save_safetensors_atomic", write)
    CheckpointSync([engine], directory=tmp_path).push(trainer.named_parameters(), 1)
    assert engine.version == 1 and check_logprob_parity(engine, trainer, PROMPT) < 1e-4
