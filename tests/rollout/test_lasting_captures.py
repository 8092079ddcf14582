"""Static decode's steps (CUDA graphs on a GPU) last: one per (arena, bucket) made once and
reused across `generate` calls, weight updates in place and `baton serve`'s interleaved
requests (`baton.rollout.embedded.static_decode.DecodeGraphs`). On a CPU the step runs eagerly, so what
is counted is the decision to make one (`DecodeGraphs.captures`); the captures themselves run
in tests/gpu/test_engine_cuda.py."""

import pytest
import torch

from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from baton.rollout.embedded.static_decode import DecodeGraphs, bucket_sizes
from tests.rollout.test_static_decode import PROMPTS, SAMPLED, STOPPING, check_interleaving, tiny

pytestmark = pytest.mark.usefixtures("replays")  # "graph" steps as checked replays (tests/graph_replay.py)

GREEDY = SamplingParams(n=3, temperature=0, max_new_tokens=10, stop_token_ids=list(range(100, 130)))


@pytest.fixture
def buckets(monkeypatch):
    """Every bucket a StaticDecoder entered during the test."""
    from baton.rollout.embedded import static_decode

    seen: set[int] = set()
    real = static_decode.StaticDecoder._make_step

    def spy(self):
        seen.add(self.size)
        return real(self)

    monkeypatch.setattr(static_decode.StaticDecoder, "_make_step", spy)
    return seen


@pytest.mark.parametrize("fuse", [True, False])
def test_one_capture_per_bucket_across_calls(fuse, buckets):
    """Three calls (other seeds: other rows finish, other buckets) make one step per bucket
    entered, not one per call; fused weights are refilled in place, keeping their addresses."""
    engine = EmbeddedEngine(tiny("qwen2"), static_decode=True, fuse_weights=fuse)
    for seed in (1, 2, 3):
        engine.generate(PROMPTS, SamplingParams(**{**vars(STOPPING), "seed": seed}))
    engine.generate(PROMPTS[:2], SamplingParams(**{**vars(STOPPING), "seed": 4}))  # 6 rows: the same arena
    assert len(buckets) > 2  # rows finished: the batch went down several buckets
    assert engine.graphs.captures == len(buckets) <= len(bucket_sizes(12))
    assert len(engine.graphs.idle) == 1  # one arena, kept for the next call
    # the step samples too: other sampling settings are other steps (of the buckets they enter)
    before = engine.graphs.captures
    buckets.clear()
    engine.generate(PROMPTS[:2], SAMPLED)
    assert engine.graphs.captures == before + len(buckets)


def test_updated_weights_are_read_by_the_kept_steps():
    """An update in place (a colocated optimizer step, `update_weights`) keeps the addresses:
    the steps stay, and they read the new weights (the tokens a fresh engine gives)."""
    old, new = tiny("llama"), tiny("llama", seed=1)
    engine = EmbeddedEngine(old, static_decode=True)
    before = engine.generate(PROMPTS, GREEDY)
    captures = engine.graphs.captures
    engine.update_weights(new.state_dict().items(), version=1)
    after = engine.generate(PROMPTS, GREEDY)
    want = EmbeddedEngine(tiny("llama", seed=1), static_decode=True).generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in after] == [c.token_ids for c in want] != [c.token_ids for c in before]
    assert engine.graphs.captures <= max(captures, len(bucket_sizes(12)))


def test_other_weight_addresses_drop_the_steps():
    """Weights at other addresses (a new fused copy) make the arena's steps anew: a graph
    over the old addresses would read freed memory."""
    engine = EmbeddedEngine(tiny("qwen2"), static_decode=True)
    engine.generate(PROMPTS, GREEDY)
    captures = engine.graphs.captures
    engine.runner.forget()  # the next pack builds a new fused copy (other addresses)
    engine.generate(PROMPTS, GREEDY)
    assert engine.graphs.captures > captures


def test_sleep_drops_the_arenas():
    engine = EmbeddedEngine(tiny("qwen2"), static_decode=True)
    engine.generate(PROMPTS, GREEDY)
    assert engine.graphs.idle and engine.graphs.idle_bytes() > 0
    engine.sleep()
    assert not engine.graphs.idle
    engine.wake()
    assert [c.token_ids for c in engine.generate(PROMPTS, GREEDY)] == \
        [c.token_ids for c in EmbeddedEngine(tiny("qwen2")).generate(PROMPTS, GREEDY)]


def test_interleaved_requests_share_the_kept_steps(buckets):
    """`baton serve`'s interleaving: each generation in flight leases an arena of its own;
    after the first round, more rounds make no new step."""
    engine = EmbeddedEngine(tiny("qwen2"), static_decode=True)
    calls = [(PROMPTS, GREEDY), (PROMPTS[:2], GREEDY)]
    check_interleaving(engine, calls)
    captures = engine.graphs.captures
    assert len(engine.graphs.idle) == 2  # two ran at once: two arenas
    for _ in range(2):
        check_interleaving(engine, calls)
    assert engine.graphs.captures == captures


def test_the_decode_graphs_need_no_engine():
    """The pool alone: a lease of more rows than an idle arena holds drops it for a bigger one."""
    engine = EmbeddedEngine(tiny("qwen2"))
    runner, graphs = engine.runner, DecodeGraphs()
    ids, mask = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    with torch.inference_mode():
        runner.pack()
        runner.start(ids, mask, max_new=4, n=2)
        small = graphs.lease(runner, 4)
        graphs.give_back(small)
        assert graphs.lease(runner, 3) is small  # 3 rows fit its 4
        graphs.give_back(small)
        big = graphs.lease(runner, 5)
    assert big is not small and big.capacity == 6 and graphs.idle == []
