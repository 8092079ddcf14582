"""Verified weight versions (issue 49): the checkpoint, broadcast and LoRA transports send a
digest per tensor of what they sent; `baton serve` (and a receiver in process) checks every
tensor it got against it before installing, and refuses a mismatch (409, one line naming the
tensor) keeping its old version serving. The corruption is injected for real between the
send and the load (a flipped byte of a tensor's data, which every earlier check let through;
a file cut short of a tensor; a broadcast whose buffer's tail never arrived)."""

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


def flip_a_byte(path: Path, name: str = NAME) -> None:
    """XOR 1 into the lowest byte of `name`'s first element: a finite value, the right shape."""
    data = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", data[:8])[0]
    start = json.loads(data[8:8 + header_len])[name]["data_offsets"][0]
    data[8 + header_len + start] ^= 1
    path.write_bytes(bytes(data))


def drop_a_tensor(path: Path, name: str = NAME) -> None:
    """Rewrite the file without `name` (a transfer cut short of one tensor)."""
    save_safetensors_atomic([(n, t) for n, t in iter_safetensors(path) if n != name], path)


class Injected(RemoteEngine):
    """The real client of `baton serve`, with `fault` applied to the file before the load."""

    def __init__(self, url: str, fault):
        super().__init__(url)
        self.fault = fault

    def update_weights_from_disk(self, path, version, digests=None, **kw):
        if self.fault is not None:
            self.fault(Path(path))
        super().update_weights_from_disk(path, version, digests=digests, **kw)


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
    from baton.rollout.embedded.engine import EmbeddedEngine

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


# --- the broadcast transport: into `baton serve` over HTTP and a receiver in this process --------

def flip_in_transit(sync, name_index: int, fault: str) -> None:
    """Corrupt broadcast number `name_index` (bucket_mb=0: one tensor per broadcast) on the
    trainer's real gloo group, after the digests were taken: "flip" XORs 1 into its first
    byte; "cut" zeroes its second half (a transfer cut short: the receive buffer's tail never
    filled)."""
    real, calls = sync.group.broadcast, [0]

    def broadcast(tensor, src=0):
        if calls[0] == name_index:
            tensor = tensor.clone()
            raw = tensor.view(-1).view(torch.uint8)
            if fault == "flip":
                raw[0] ^= 1
            else:
                raw[raw.numel() // 2:] = 0
        calls[0] += 1
        real(tensor, src)
    sync.group.broadcast = broadcast


@pytest.mark.parametrize("fault", ["flip", "cut"])
def test_a_corrupted_broadcast_is_refused_by_each_receiver_and_the_old_version_serves(fresh_served, make_tiny_qwen,
                                                                                     srv_tokenizer, fault):
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.sync import BroadcastSync, WeightReceiver

    s = fresh_served()
    original, trainer = make_tiny_qwen(0), make_tiny_qwen(1)
    local = EmbeddedEngine(make_tiny_qwen(0), srv_tokenizer)
    names = [n for n, _ in trainer.named_parameters()]
    for receiver in (RemoteEngine(s.url), WeightReceiver(local)):
        engine = s.engine if isinstance(receiver, RemoteEngine) else local
        sync = BroadcastSync([receiver], bucket_mb=0, timeout_s=60)
        try:
            flip_in_transit(sync, names.index(NAME), fault)
            with pytest.raises(WeightDigestError) as err:
                sync.push(trainer.named_parameters(), 1)
            line = str(err.value)
            assert "\n" not in line and f"tensor {NAME!r}: digest " in line, line
            assert engine.version == 0 and check_logprob_parity(engine, original, PROMPT) < 1e-6
            sync.group.broadcast = type(sync.group).broadcast.__get__(sync.group)  # the fault gone
            sync.push(trainer.named_parameters(), 1)  # the same group, intact: installed
            assert engine.version == 1 and check_logprob_parity(engine, trainer, PROMPT) < 1e-4
        finally:
            sync.close()
    with httpx.Client(base_url=s.url, timeout=60) as c:
        assert c.get("/health").json()["version"] == 1


# --- the LoRA transport into `baton serve`: the adapter dir it wrote, checked by the server -------

def test_a_corrupted_adapter_is_refused_and_the_loaded_one_serves(tmp_path, monkeypatch):
    from baton.models.lora import adapter_config, adapter_tensors
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.protocol import SamplingParams
    from baton.rollout.server import ServerThread, build_app
    from baton.sync.lora import LoraSync
    from tests.rollout.test_lora_serving import tiny_llama, trained_peft

    engine = EmbeddedEngine(tiny_llama(), eos_token_ids=[2], pad_token_id=0, fuse_weights=False)
    (tmp_path / "ok").mkdir()
    pm = trained_peft()
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=6, ignore_eos=True, lora="policy")
    with ServerThread(build_app(engine, None, "base", weights_dirs=[tmp_path / "ok"])) as srv:
        sync = LoraSync([RemoteEngine(srv.url)], adapter_config(pm), name="policy", directory=tmp_path / "ok")
        sync.push(adapter_tensors(pm), 1)
        before = engine.generate([PROMPT], params)[0]
        key = next(k for k, _ in adapter_tensors(pm) if "lora_B" in k)
        write = sync._write
        for fault, needle in ((flip_a_byte, f"tensor {key!r}: digest "),
                              (drop_a_tensor, f"tensor {key!r} was sent and did not arrive")):
            def write_then_fault(tensors, version, fault=fault):
                out = write(tensors, version)
                fault(out / "adapter_model.safetensors", key)
                return out
            monkeypatch.setattr(sync, "_write", write_then_fault)
            with torch.no_grad():
                next(p for n, p in pm.named_parameters() if "lora_B" in n).add_(0.1)
            with pytest.raises(RemoteEngineError) as err:
                sync.push(adapter_tensors(pm), 2)
            assert "\n" not in str(err.value) and needle in str(err.value), str(err.value)
            after = engine.generate([PROMPT], params)[0]
            assert after.token_ids == before.token_ids and after.logprobs == before.logprobs  # the old adapter
        monkeypatch.setattr(sync, "_write", write)
        sync.push(adapter_tensors(pm), 2)
        assert engine.generate([PROMPT], params)[0].logprobs != before.logprobs


# --- the object store transport: a generator on its own pool ------------------------------------

@pytest.mark.parametrize("fault", ["flip", "drop"])
def test_a_corrupted_object_store_payload_is_refused_and_the_generator_keeps_its_weights(make_tiny_qwen,
                                                                                         srv_tokenizer, fault):
    """`WeightsWorker.full_weights`' payload (`wire_weights`) as the generator gets it from the
    object store, one byte of a tensor flipped or a tensor missing: `weights_from_wire` refuses
    it before `load_weights` installs anything."""
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.workers.generator import weights_from_wire, wire_weights

    original, trainer = make_tiny_qwen(0), make_tiny_qwen(1)
    engine = EmbeddedEngine(make_tiny_qwen(0), srv_tokenizer)
    payload = wire_weights(trainer.named_parameters())
    if fault == "flip":
        payload["tensors"][NAME] = payload["tensors"][NAME].copy()
        payload["tensors"][NAME].view("uint8")[0] ^= 1
        needle = f"tensor {NAME!r}: digest "
    else:
        del payload["tensors"][NAME]
        needle = f"tensor {NAME!r} was sent and did not arrive"
    with pytest.raises(WeightDigestError, match=needle):
        engine.update_weights(weights_from_wire(payload), 1)
    assert engine.version == 0 and check_logprob_parity(engine, original, PROMPT) < 1e-6
    engine.update_weights(weights_from_wire(wire_weights(trainer.named_parameters())), 1)
    assert engine.version == 1 and check_logprob_parity(engine, trainer, PROMPT) < 1e-4


# --- a generator's broadcast group with the actor: the digests follow the buckets in band --------

@pytest.mark.parametrize("fault", ["flip", "cut"])
def test_a_corrupted_generator_broadcast_is_refused_and_the_generator_keeps_its_weights(make_tiny_qwen,
                                                                                        srv_tokenizer, fault):
    """What `WeightsWorker.send_weights` and `GeneratorWorker.receive_weights` run, on a real
    gloo group (set up by a BroadcastSync here): the buckets, then their digests; the
    receiver checks before it installs (`WeightReceiver.receive_checked`)."""
    from concurrent.futures import ThreadPoolExecutor

    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.sync import BroadcastSync, WeightReceiver
    from baton.sync.group import dtype_name, plan_buckets, send_buckets, send_digests

    original, trainer = make_tiny_qwen(0), make_tiny_qwen(1)
    engine = EmbeddedEngine(make_tiny_qwen(0), srv_tokenizer)
    receiver = WeightReceiver(engine)
    sync = BroadcastSync([receiver], bucket_mb=0, timeout_s=60)
    named = list(trainer.named_parameters())
    names, dtypes, shapes = [n for n, _ in named], [dtype_name(t.dtype) for _, t in named], [list(t.shape) for _, t in named]
    plan = plan_buckets(list(zip(names, dtypes, shapes)), None)

    def send() -> None:
        sent: dict[int, str] = {}
        send_buckets(sync.group, [t for _, t in named], plan, digests=sent)
        send_digests(sync.group, [sent[i] for i in range(len(named))])
    try:
        with ThreadPoolExecutor(1) as pool:
            flip_in_transit(sync, names.index(NAME), fault)
            sender = pool.submit(send)
            with pytest.raises(WeightDigestError, match=f"tensor {NAME!r}: digest "):
                receiver.receive_checked(names, dtypes, shapes, 1)
            sender.result()
            assert engine.version == 0 and check_logprob_parity(engine, original, PROMPT) < 1e-6
            sync.group.broadcast = type(sync.group).broadcast.__get__(sync.group)
            sender = pool.submit(send)
            receiver.receive_checked(names, dtypes, shapes, 1)
            sender.result()
        assert engine.version == 1 and check_logprob_parity(engine, trainer, PROMPT) < 1e-4
    finally:
        sync.close()


def test_a_server_reports_what_it_holds_by_content_and_a_tampered_one_differs(fresh_served, make_tiny_qwen,
                                                                             srv_tokenizer, tmp_path):
    """`/weights_digest` (the API path's `sync/verified`): the version and each tensor's digest,
    hashed by the server from its model, equal what a push sent; weights installed after it
    through the server's own admin endpoint (the same version number) are seen by content."""
    from baton.sync.verify import digests_held

    s = fresh_served(weights_dirs=[str(tmp_path)])
    trainer = make_tiny_qwen(1)
    sync = CheckpointSync([RemoteEngine(s.url)], directory=tmp_path, delta=False)
    sync.push(trainer.named_parameters(), 3)
    with httpx.Client(base_url=s.url, timeout=60) as c:
        held = c.post("/weights_digest", json={}).json()
        assert held["weight_version"] == 3 and held["dtypes"][NAME] == "float32"
        assert digests_held(held["digests"], sync.held.digests) == (True, None)
        assert set(c.post("/weights_digest", json={"digests": False}).json()) == {"weight_version", "dtypes"}
        assert c.post("/weights_digest", json={"digest": False}).status_code == 422  # a typo is not ignored
        other = dict(trainer.named_parameters())
        other[NAME] = other[NAME].detach() + 1.0
        path = save_safetensors_atomic([(NAME, other[NAME])], tmp_path / "tampered.safetensors")
        assert c.post("/update_weights_from_disk", json={"model_path": str(path), "version": 3}).json()["success"]
        held = c.post("/weights_digest", json={}).json()
        assert held["weight_version"] == 3  # the version says nothing changed; the content does
        assert digests_held(held["digests"], sync.held.digests) == (False, NAME)
    from baton.rollout.embedded.engine import EmbeddedEngine

    model = make_tiny_qwen(0)
    asleep = fresh_served(model=model, engine=EmbeddedEngine(model, srv_tokenizer, sleep_mode="discard"))
    with httpx.Client(base_url=asleep.url, timeout=60) as c:
        assert c.post("/release_memory_occupation", json={}).json()["success"]
        r = c.post("/weights_digest", json={})
        assert r.status_code == 409 and "discarded" in r.json()["message"]  # nothing held to report
