"""`RemoteEngine` against baton's own server, in each dialect, plus weight updates."""

from __future__ import annotations

import pickle

import pytest

from baton.protocol import Completion, Engine, SamplingParams
from baton.rollout.remote import RemoteEngine, RemoteEngineError
from baton.sync import check_logprob_parity

GREEDY = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7], [8, 9], [10]]


@pytest.mark.parametrize("dialect", ["baton", "sglang", "vllm"])
def test_generate_matches_engine(served, dialect):
    remote = RemoteEngine(served.url, dialect=dialect)
    assert isinstance(remote, Engine)
    params = SamplingParams(n=2, temperature=0, max_new_tokens=6, ignore_eos=True)
    ref = served.engine.generate(PROMPTS, params)
    got = remote.generate(PROMPTS, params)
    assert all(isinstance(c, Completion) for c in got)
    assert [c.prompt_index for c in got] == [0, 0, 1, 1, 2, 2]
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    for a, b in zip(got, ref):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.finish_reason == b.finish_reason == "length"
    remote.close()


@pytest.mark.parametrize("dialect", ["baton", "sglang", "vllm"])
def test_sampling_options_travel(served, dialect):
    remote = RemoteEngine(served.url, dialect=dialect)
    seeded = SamplingParams(n=3, temperature=1.0, top_k=20, top_p=0.9, max_new_tokens=8, seed=7)
    a, b = remote.generate(PROMPTS[:2], seeded), remote.generate(PROMPTS[:2], seeded)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]  # the seed reached the engine
    assert [c.token_ids for c in a] == [c.token_ids for c in served.engine.generate(PROMPTS[:2], seeded)]
    first = remote.generate([[5]], GREEDY)[0].token_ids[0]
    stopped = remote.generate([[5]], SamplingParams(temperature=0, max_new_tokens=6, stop_token_ids=[first]))[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"


def test_update_weights_and_version(fresh_served, make_tiny_qwen, tmp_path):
    s = fresh_served()
    remote = RemoteEngine(s.url, weights_dir=str(tmp_path))
    trainer = make_tiny_qwen(1)
    assert check_logprob_parity(remote, trainer, [4, 5, 6]) > 1e-2
    remote.update_weights(trainer.named_parameters(), version=5)
    assert remote.version == 5 and s.engine.version == 5
    assert check_logprob_parity(remote, trainer, [4, 5, 6]) < 1e-4
    assert all(c.version == 5 for c in remote.generate(PROMPTS, GREEDY))
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone
    with pytest.raises(RemoteEngineError, match="unknown parameter"):
        remote.update_weights([("no.such.weight", trainer.lm_head.weight)], version=6)


def test_sleep_wake_and_errors(fresh_served):
    s = fresh_served()
    remote = RemoteEngine(s.url)
    remote.sleep()
    with pytest.raises(RemoteEngineError, match="503"):
        remote.generate(PROMPTS, GREEDY)
    remote.wake()
    assert len(remote.generate(PROMPTS, GREEDY)) == 3
    with pytest.raises(RemoteEngineError, match="400"):
        remote.generate([[]], GREEDY)
    with pytest.raises(NotImplementedError, match="checkpoint"):  # no broadcast into vLLM: its transfer is CUDA
        RemoteEngine(s.url, dialect="vllm").init_weights_update_group("127.0.0.1", 1, 1, 2)
    with pytest.raises(ValueError):
        RemoteEngine(s.url, dialect="tgi")


def test_pickles_and_waits(served):
    remote = RemoteEngine(served.url)
    remote.wait_ready(timeout=5)
    assert remote.generate([[5]], GREEDY)  # opens a client
    clone = pickle.loads(pickle.dumps(remote))  # e.g. shipped to a Ray actor
    assert clone.generate([[5]], GREEDY)[0].token_ids == remote.generate([[5]], GREEDY)[0].token_ids
    assert not RemoteEngine("http://127.0.0.1:9").health()


def test_api_key_travels_and_survives_pickling(fresh_served):
    s = fresh_served(api_key="k3y")
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=3)
    with pytest.raises(RemoteEngineError, match="401"):
        RemoteEngine(s.url, api_key="").generate([[5, 6]], params)
    remote = pickle.loads(pickle.dumps(RemoteEngine(s.url, api_key="k3y")))  # as Ray ships it
    assert len(remote.generate([[5, 6]], params)[0].token_ids) == 3
