"""Fixtures for the server / remote-engine tests: a tiny Qwen2, the byte tokenizer, and a
real uvicorn server on a free 127.0.0.1 port in a background thread."""

from __future__ import annotations

import pytest
import torch

from baton.models.tiny import build_tiny_model
from baton.models.tokenizer import build_char_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.server import ServerThread, build_app

torch.set_num_threads(1)  # the machine is shared; tiny models gain nothing from more


def tiny_qwen(seed: int = 0) -> torch.nn.Module:
    """A seeded 2-layer Qwen2 (hidden 64) from the project's tiny-model factory."""
    return build_tiny_model(None, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128,
                            seed=seed).eval()


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


@pytest.fixture
def replays(monkeypatch):
    """Static decode's "graph" steps run on the CPU as checked replays (tests/graph_replay.py):
    the test fails when a replay would read a storage other than the captured one, or a
    capture holds a host sync."""
    from tests.graph_replay import ReplayChecker

    checker = ReplayChecker().install(monkeypatch)
    yield checker
    checker.assert_clean()
