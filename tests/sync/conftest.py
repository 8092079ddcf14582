"""Fixtures for the weight-sync tests: tiny Qwen2 models (trainer and engine differ by
seed) and baton servers on free 127.0.0.1 ports in background threads."""

from __future__ import annotations

import pytest
import torch

from baton.models.tiny import build_tiny_model
from baton.models.tokenizer import build_char_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.server import ServerThread, build_app

torch.set_num_threads(1)


def _tiny_qwen(seed: int = 0) -> torch.nn.Module:
    """A seeded 2-layer Qwen2 (hidden 64) from the project's tiny-model factory."""
    return build_tiny_model(None, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128,
                            seed=seed).eval()


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
