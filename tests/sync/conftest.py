"""Fixtures for the weight-sync tests: tiny Qwen2 models (trainer and engine differ by
seed) and baton servers on free 127.0.0.1 ports in background threads."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from baton.models.tokenizer import build_char_tokenizer
from baton.rollout.engine import EmbeddedEngine
from baton.rollout.server import ServerThread, build_app

torch.set_num_threads(1)



def _tiny_qwen(seed: int = 0) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_qwen():
    return _tiny_qwen


@pytest.fixture(scope="session")
def sync_tokenizer():
    return build_char_tokenizer()


@pytest.fixture
def start_server(sync_tokenizer):
    """start_server() -> (url, engine): a fresh server over a seed-0 model."""
    threads = []

    def start(seed: int = 0):
        engine = EmbeddedEngine(_tiny_qwen(seed), sync_tokenizer)
        threads.append(ServerThread(build_app(engine, sync_tokenizer, "tiny")))
        return threads[-1].url, engine

    yield start
    for t in threads:
        t.stop()
