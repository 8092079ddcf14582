"""The graph-replay checker (tests/graph_replay.py) finds what a CUDA graph kept across calls
would read wrongly, and the engine's kept steps pass it: every table a step reads is its
arena's (`baton.rollout.embedded.static_decode.Arena`), so `release()` and the next call's `start()`
leave the captured storages alone. The engine's other graph tests (test_lasting_captures.py,
test_static_decode.py) run under the same checker."""

import pytest
import torch

from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from tests.graph_replay import ReplayChecker, ReplayCheckedStep
from tests.rollout.test_static_decode import PROMPTS, STOPPING, check_interleaving, tiny


def _step(fn):
    checker = ReplayChecker()
    return ReplayCheckedStep(fn, torch.device("cpu"), checker), checker


def test_a_replay_of_a_replaced_table_is_bad():
    table = {"t": torch.arange(4.0)}
    x = torch.ones(4)
    step, checker = _step(lambda: x * table["t"])
    step()
    assert torch.equal(step(), torch.arange(4.0)) and not checker.bad  # the same storages: a good replay
    table["t"] = torch.arange(4.0) + 1  # the old one is freed; the graph would still read it
    step()
    assert len(checker.bad) == 1 and "freed" in checker.bad[0]


def test_a_replay_reading_another_view_is_bad():
    buf = torch.zeros(8)
    view = {"v": buf[:4]}
    step, checker = _step(lambda: view["v"] + 1)
    step()
    view["v"] = buf[4:]  # alive, but another offset
    step()
    assert len(checker.bad) == 1 and "captured" in checker.bad[0]


def test_outputs_are_overwritten_by_the_next_replay_as_a_graphs_are():
    x = torch.zeros(2)
    step, _ = _step(lambda: x + 1)
    step()
    first = step()
    x.fill_(5)
    second = step()
    assert first is second and torch.equal(first, torch.full((2,), 6.0))


@pytest.mark.parametrize("sync", [lambda t: t.sum().item(), lambda t: t.tolist(), lambda t: t.cpu(),
                                  lambda t: t[t > 0]])
def test_a_host_sync_in_a_capture_is_a_fault(sync):
    x = torch.ones(3)
    step, checker = _step(lambda: (sync(x), x * 2)[1])
    step()
    assert len(checker.bad) == 1 and "host syncs" in checker.bad[0], checker.bad


@pytest.mark.parametrize("family, kw", [("qwen2", {}), ("mixtral", {"experts": 4, "top_k": 2}),
                                        ("qwen3_moe", {"experts": 8, "top_k": 2})])  # the MoE: gathered / all experts
def test_kept_steps_read_the_arenas_tables_across_calls(replays, family, kw):
    """Three calls of other lengths and seeds, each dropping its tables (`release`) and making
    new ones (`start`): every replay of a kept step reads what it captured."""
    engine = EmbeddedEngine(tiny(family, **kw), static_decode=True)
    want = EmbeddedEngine(tiny(family, **kw)).generate
    for seed, prompts in ((1, PROMPTS), (2, PROMPTS[1:]), (3, PROMPTS)):
        params = SamplingParams(**{**vars(STOPPING), "seed": seed})
        got = engine.generate(prompts, params)
        engine.runner.release()  # what sleep does; a later start() makes new tables too
        assert [c.token_ids for c in got] == [c.token_ids for c in want(prompts, params)]
    assert replays.replays > 20 and replays.captures > 2
    replays.assert_clean()


def test_interleaved_generations_replay_their_own_arenas(replays):
    engine = EmbeddedEngine(tiny("llama"), static_decode=True)
    calls = [(PROMPTS, STOPPING), (PROMPTS[:2], SamplingParams(**{**vars(STOPPING), "seed": 5}))]
    for _ in range(2):
        check_interleaving(engine, calls)
    assert replays.replays > 20
    replays.assert_clean()
