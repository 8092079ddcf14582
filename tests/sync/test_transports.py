"""Each weight-sync transport makes the engine's logprobs equal the trainer's."""

from __future__ import annotations

import time

import pytest
import torch

from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from baton.rollout.remote import RemoteEngine
from baton.sync import (BroadcastSync, CheckpointSync, InplaceSync, WeightReceiver, WeightSync, build_transport,
                        check_logprob_parity)
from baton.sync.group import plan_buckets
PROMPT = [5, 9, 11, 4, 7]  # the fixed sequence parity is checked on

GREEDY = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Stand-in for an optimizer step."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def test_plan_buckets():
    specs = [("a", "float32", [10]), ("b", "float32", [10]), ("c", "float32", [100]),
             ("d", "bfloat16", [4]), ("e", "bfloat16", [4]), ("f", "float32", [1])]
    assert plan_buckets(specs, None) == [[0], [1], [2], [3], [4], [5]]
    # 80 bytes fit a+b; c (400 B) is alone; a dtype change always starts a new bucket
    assert plan_buckets(specs, 80) == [[0, 1], [2], [3, 4], [5]]
    assert plan_buckets(specs, 10**6) == [[0, 1, 2], [3, 4], [5]]


def test_inplace(tiny_qwen, sync_tokenizer):
    trainer = tiny_qwen(0)
    engine = EmbeddedEngine(trainer, sync_tokenizer)  # colocated: the same module
    sync = InplaceSync(engine)
    assert isinstance(sync, WeightSync)
    before = engine.generate([PROMPT], GREEDY)[0].logprobs
    _perturb(trainer, 1)
    sync.push(trainer.named_parameters(), version=1)
    after = engine.generate([PROMPT], GREEDY)[0]
    assert after.version == 1 and after.logprobs != pytest.approx(before, abs=1e-3)
    assert check_logprob_parity(engine, trainer, PROMPT) < 1e-4


def test_checkpoint_in_process(tiny_qwen, sync_tokenizer, tmp_path):
    engine = EmbeddedEngine(tiny_qwen(0), sync_tokenizer)
    trainer = tiny_qwen(1)
    assert check_logprob_parity(engine, trainer, PROMPT) > 1e-2  # the check can fail
    sync = build_transport("checkpoint", "colocated", [engine], directory=tmp_path, keep_last=1)
    for version in (1, 2):
        _perturb(trainer, version)
        sync.push(trainer.named_parameters(), version)
        assert engine.version == version
        assert check_logprob_parity(engine, trainer, PROMPT) < 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights-v2.safetensors"]  # no temp files, one kept
    sync.close()
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_remote(tiny_qwen, start_server):
    url, served_engine = start_server()
    trainer = tiny_qwen(1)
    remote = RemoteEngine(url)
    sync = CheckpointSync([remote])
    sync.push(trainer.named_parameters(), version=7)
    assert served_engine.version == 7 and remote.version == 7
    assert check_logprob_parity(remote, trainer, PROMPT) < 1e-4
    sync.close()
    assert not sync.directory.exists()


@pytest.mark.parametrize("bucket_mb", [0.02, 0])  # 20 KB buckets (several per push) / one tensor each
def test_broadcast_to_servers(tiny_qwen, start_server, sync_tokenizer, bucket_mb):
    (url_a, eng_a), (url_b, eng_b) = start_server(), start_server()
    local = EmbeddedEngine(tiny_qwen(0), sync_tokenizer)  # a third engine hosted in-process
    trainer = tiny_qwen(1)
    sync = BroadcastSync([RemoteEngine(url_a), RemoteEngine(url_b), WeightReceiver(local)], bucket_mb=bucket_mb)
    assert sync.group.world_size == 4 and sync.backend == "gloo"
    for version in (1, 2):
        _perturb(trainer, 10 + version)
        sync.push(trainer.named_parameters(), version)
        for url, eng in ((url_a, eng_a), (url_b, eng_b), (None, local)):
            assert eng.version == version
            target = RemoteEngine(url) if url else eng
            assert check_logprob_parity(target, trainer, PROMPT) < 1e-4
    sync.close()


def test_broadcast_error_surfaces_quickly(tiny_qwen, start_server):
    url, eng = start_server()
    sync = BroadcastSync([RemoteEngine(url)], bucket_mb=1, timeout_s=60)
    params = list(tiny_qwen(1).named_parameters())
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="unknown parameter"):
        sync.push(params + [("not.a.param", torch.zeros(3))], version=1)
    assert time.monotonic() - start < 20  # not the group timeout
    with pytest.raises(RuntimeError, match="broken"):
        sync.push(params, version=2)
    sync.close()


def test_broadcast_cast_dtype(tiny_qwen, start_server):
    url, eng = start_server()
    trainer = tiny_qwen(1)
    sync = BroadcastSync([RemoteEngine(url)], bucket_mb=1, cast_dtype=torch.bfloat16)  # half the bytes on the wire
    sync.push(trainer.named_parameters(), version=1)
    w = dict(eng.model.named_parameters())["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(w, trainer.model.layers[0].mlp.up_proj.weight.to(torch.bfloat16).float())
    sync.close()
