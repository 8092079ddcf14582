"""Fixtures for the server / remote-engine tests: a tiny Qwen2, the byte tokenizer, and a
real uvicorn server on a free 127.0.0.1 port in a background thread."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from baton.models.tokenizer import build_char_tokenizer
from baton.rollout.engine import EmbeddedEngine
from baton.rollout.server import ServerThread, build_app

torch.set_num_threads(1)  # the machine is shared; tiny models gain nothing from more


def tiny_qwen(seed: int = 0) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


class Served:
    """A running server and the objects behind it."""

    def __init__(self, model, tokenizer, engine=None, **app_kwargs):
        self.model, self.tokenizer = model, tokenizer
        self.engine = engine or EmbeddedEngine(model, tokenizer)
        self.app = build_app(self.engine, tokenizer, "tiny-qwen", **app_kwargs)
        self.thread = ServerThread(self.app)
        self.url = self.thread.url

    def stats(self) -> dict:
        return dict(self.app.state.baton.batcher.stats)

    def stop(self) -> None:
        self.thread.stop()


@pytest.fixture(scope="session")
def make_tiny_qwen():
    return tiny_qwen


@pytest.fixture(scope="session")
def srv_tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def served(srv_tokenizer):
    """Shared by a module's read-only tests (nothing may change its weights)."""
    s = Served(tiny_qwen(0), srv_tokenizer)
    yield s
    s.stop()


@pytest.fixture
def fresh_served(srv_tokenizer):
    """A server of its own, for tests that update weights or need special settings."""
    servers = []

    def make(**kwargs) -> Served:
        engine = kwargs.pop("engine", None)
        model = kwargs.pop("model", None) or tiny_qwen(0)
        servers.append(Served(model, srv_tokenizer, engine=engine, **kwargs))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()
