"""LoRA in the engine and the server: live adapters of a colocated peft policy on the fast
path (unmerged and merged-into-the-fused-copy), adapters served by name from PEFT dirs
(`/load_lora_adapter`, `/unload_lora_adapter`, vLLM's and SGLang's request shapes), the
adapter-only `LoraSync` into an in-process engine and into a server through `RemoteEngine`.

The reference for every logprob is the peft model's own HF forward, or base + adapter
merged by peft (`merge_and_unload`)."""

from __future__ import annotations

import copy

import httpx
import pytest
import torch

from baton.models.lora import LoraAdapterConfig, adapter_config, adapter_tensors, apply_lora, save_adapter
from baton.models.tiny import build_tiny_model
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from baton.rollout.remote import RemoteEngine
from baton.sync import check_logprob_parity
from baton.sync.lora import LoraSync

PROMPT = [5, 6, 7, 8]
GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=6, ignore_eos=True)
# engine (adapter cast to bf16) vs peft's forward (adapter in fp32) over a bf16 base: measured
# 0.0039 max; a bf16 logit is rounded by up to 2^-9 of itself (a few units here: ~0.01)
BF16_PARITY = 0.02


def tiny_llama():
    return build_tiny_model(None, family="llama", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128,
                            seed=0).eval()


def trained_peft(seed=1):
    """A peft model whose adapters are not zero (peft starts lora_B at 0: a no-op)."""
    pm = apply_lora(tiny_llama(), LoraAdapterConfig(rank=4, alpha=8))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return pm.eval()


def merged_logprobs(pm, prompt, tokens):
    merged = copy.deepcopy(pm).merge_and_unload()
    seq = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(merged(input_ids=seq).logits[0].float(), -1)
    return logp[len(prompt) - 1:-1].gather(-1, seq[0, len(prompt):, None])[:, 0]


@pytest.mark.parametrize("fuse", [False, True])
def test_live_adapters_on_the_fast_path(fuse):
    pm = trained_peft()
    engine = EmbeddedEngine(pm, eos_token_ids=[2], pad_token_id=0, fuse_weights=fuse)
    assert type(engine.runner).__name__ == "LlamaRunner"
    assert check_logprob_parity(engine, pm, PROMPT, 8) < 1e-5
    with torch.no_grad():  # an "optimizer step" on the adapters is seen by the next generate
        next(p for n, p in pm.named_parameters() if "lora_A" in n).mul_(3.0)
    assert check_logprob_parity(engine, pm, PROMPT, 8) < 1e-5
    with pm.disable_adapter():  # the reference policy: the base, adapters off
        assert check_logprob_parity(engine, pm, PROMPT, 8) < 1e-5


def test_adapter_by_name_in_process(tmp_path):
    pm = trained_peft()
    save_adapter(adapter_tensors(pm), adapter_config(pm), tmp_path)
    engine = EmbeddedEngine(tiny_llama(), eos_token_ids=[2], pad_token_id=0, fuse_weights=False)
    base = engine.generate([PROMPT], GREEDY)[0]
    nbytes = engine.load_lora_adapter("a", str(tmp_path))
    assert nbytes == sum(t.numel() * 4 for _, t in adapter_tensors(pm))
    c = engine.generate([PROMPT], SamplingParams(**{**GREEDY.__dict__, "lora": "a"}))[0]
    ref = merged_logprobs(pm, PROMPT, c.token_ids)
    assert (ref - torch.tensor(c.logprobs)).abs().max() < 1e-5
    assert engine.generate([PROMPT], GREEDY)[0].logprobs == base.logprobs  # the base is untouched
    engine.unload_lora_adapter("a")
    with pytest.raises(KeyError, match="unknown LoRA adapter"):
        engine.generate([PROMPT], SamplingParams(**{**GREEDY.__dict__, "lora": "a"}))
    bad = dict(adapter_tensors(pm))
    key = next(k for k in bad if "lora_A" in k)
    bad[key] = bad[key][:, :3]
    with pytest.raises(ValueError, match="do not fit"):
        engine.load_lora_adapter("b", (adapter_config(pm), bad))


@pytest.fixture
def lora_server(tmp_path):
    from baton.rollout.server import ServerThread, build_app

    engine = EmbeddedEngine(tiny_llama(), eos_token_ids=[2], pad_token_id=0, fuse_weights=False)
    app = build_app(engine, None, "base", weights_dirs=[tmp_path / "ok"])
    (tmp_path / "ok").mkdir()
    with ServerThread(app) as srv:
        yield srv, engine, tmp_path


def test_server_loads_serves_and_unloads_adapters(lora_server):
    srv, engine, tmp = lora_server
    pm = trained_peft()
    save_adapter(adapter_tensors(pm), adapter_config(pm), tmp / "ok")
    (tmp / "no").mkdir()
    save_adapter(adapter_tensors(pm), adapter_config(pm), tmp / "no")
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(tmp / "no")})
        assert r.status_code == 403  # outside --weights-dir
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(tmp / "ok")})
        assert r.status_code == 200 and r.json()["success"], r.text
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["base", "sql"]
        sp = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
        # SGLang: /generate with lora_path = the adapter's name
        out = c.post("/generate", json={"input_ids": PROMPT, "sampling_params": sp, "return_logprob": True,
                                        "lora_path": "sql"}).json()
        lps = torch.tensor([x[0] for x in out["meta_info"]["output_token_logprobs"]])
        assert (merged_logprobs(pm, PROMPT, out["output_ids"]) - lps).abs().max() < 1e-5
        # vLLM: /v1/completions with model = the adapter's name; the base name gives the base
        body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 1,
                "return_token_ids": True}
        lora = c.post("/v1/completions", json={**body, "model": "sql"}).json()["choices"][0]
        assert lora["token_ids"] == out["output_ids"]
        plain = c.post("/v1/completions", json={**body, "model": "base"}).json()["choices"][0]
        assert plain["logprobs"]["token_logprobs"] == pytest.approx(
            [c_.logprobs for c_ in engine.generate([PROMPT], GREEDY)][0], abs=1e-6)
        assert c.post("/unload_lora_adapter", json={"lora_name": "sql"}).json()["success"]
        assert c.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 400
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["base"]


def test_lora_sync_moves_only_the_adapter(lora_server):
    """Trainer side: a peft policy; engines: one in process, one behind the server."""
    srv, engine, tmp = lora_server
    pm = trained_peft()
    local = EmbeddedEngine(tiny_llama(), eos_token_ids=[2], pad_token_id=0, fuse_weights=False)
    remote = RemoteEngine(srv.url)
    sync = LoraSync([local, remote], adapter_config(pm), name="policy", directory=tmp / "ok")
    for version in (1, 2):
        with torch.no_grad():
            next(p for n, p in pm.named_parameters() if "lora_B" in n).add_(0.1)
        sync.push(adapter_tensors(pm), version)
        params = SamplingParams(**{**GREEDY.__dict__, "lora": "policy"})
        for e in (local, remote):
            c = e.generate([PROMPT], params)[0]
            assert (merged_logprobs(pm, PROMPT, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < 1e-5
            assert e.version == version
    full = sum(p.numel() * 4 for p in pm.get_base_model().parameters())
    assert sync.last_bytes == sum(t.numel() * 4 for _, t in adapter_tensors(pm)) < full / 10
    sync.close()
    remote.close()


@pytest.mark.parametrize("fuse", [False, True])
def test_live_adapters_over_a_bf16_base(fuse, replays):
    """A GPU's LoRA policy: the frozen base in bf16 (`precision.weights_dtype`), peft's adapters
    in fp32. The engine casts the adapters to the base's dtype (before issue 48: "expected m1
    and m2 to have the same dtype"), in its default decode and its "graph" steps alike."""
    pm = apply_lora(tiny_llama().to(torch.bfloat16), LoraAdapterConfig(rank=4, alpha=8))
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    pm.eval()
    assert {("lora_" in n, p.dtype) for n, p in pm.named_parameters()} == {(False, torch.bfloat16),
                                                                          (True, torch.float32)}
    for static in (False, True):
        engine = EmbeddedEngine(pm, eos_token_ids=[2], pad_token_id=0, fuse_weights=fuse, static_decode=static)
        # bf16 rounding (2^-8 of a logit) against peft's own forward, which keeps the adapter in fp32
        assert check_logprob_parity(engine, pm, PROMPT, 8) < BF16_PARITY
        assert len(engine.generate([PROMPT, PROMPT[:2]], SamplingParams(n=2, max_new_tokens=6, seed=0))) == 4
    assert replays.replays > 0
