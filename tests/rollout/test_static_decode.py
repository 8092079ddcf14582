"""Static decode (`baton.rollout.embedded.static_decode`) on the CPU: the path a GPU runs as CUDA graphs,
forced on here (the step a graph captures, run eagerly). fp32: the default path's tokens,
its logprobs to rounding; batch buckets shrink as rows finish; the host's stop checks every
k steps; one-pass prefill.
The capture itself is tested in tests/gpu/test_engine_cuda.py."""

import pytest
import torch

from baton.models import build_tiny_model
from baton.rollout.embedded import engine as engine_module
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from baton.rollout.embedded.static_decode import StaticDecoder, bucket_for, bucket_sizes, length_bucket

torch.set_num_threads(1)
pytestmark = pytest.mark.usefixtures("replays")  # "graph" steps as checked replays (tests/graph_replay.py)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [40]]  # ragged: left padding
SAMPLED = SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=0)
# 30 of the 260 ids stop a row: rows finish at different steps, and the 12-row batch shrinks
# both within a bucket (the row map) and into smaller ones
STOPPING = SamplingParams(n=3, temperature=1.0, max_new_tokens=24, seed=1, stop_token_ids=list(range(100, 130)))


def tiny(family: str = "qwen2", **kw) -> torch.nn.Module:
    sizes = dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, initializer_range=0.3,
                 tie_word_embeddings=family == "qwen2")
    return build_tiny_model(None, family=family, **{**sizes, **kw}).eval()


@pytest.fixture
def decoders(monkeypatch):
    """The StaticDecoders the engine makes during the test."""
    made = []

    def spy(*args, **kwargs):
        made.append(StaticDecoder(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(engine_module, "StaticDecoder", spy)
    return made


def test_buckets_are_powers_of_two_and_one_and_a_half_times_them():
    assert bucket_sizes(12) == [12, 8, 6, 4, 3, 2, 1]
    assert bucket_sizes(13) == [16, 12, 8, 6, 4, 3, 2, 1]
    assert bucket_sizes(1) == [1]
    assert [bucket_for(k) for k in (12, 9, 8, 5, 3, 1, 100)] == [12, 12, 8, 6, 3, 1, 128]
    # cache lengths: from 64 slots, then x1.5 / x2 steps (a GRPO run's prompt + max_new share one)
    assert [length_bucket(n) for n in (10, 64, 65, 128, 129, 200, 2560)] == [64, 64, 128, 128, 192, 256, 3072]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("step", ["fixed", True])
def test_static_decode_gives_the_default_paths_tokens(family, step, decoders):
    model = tiny(family)
    for params in (SAMPLED, STOPPING):
        ref = EmbeddedEngine(model).generate(PROMPTS, params)
        out = EmbeddedEngine(model, static_decode=step).generate(PROMPTS, params)
        assert [(c.token_ids, c.finish_reason) for c in out] == [(c.token_ids, c.finish_reason) for c in ref]
        # rounding only: SDPA sums over the masked cache slots too, and a matmul's kernel
        # depends on the row count (a bucket's padding); measured <= 5e-6
        got, want = [torch.tensor(c.logprobs) for c in out], [torch.tensor(c.logprobs) for c in ref]
        torch.testing.assert_close(torch.cat(got), torch.cat(want), atol=1e-5, rtol=0)
    # STOPPING's rows finished at different steps: the 12-row batch went down the buckets
    assert decoders[-1].buckets_used[0] == 12 and len(decoders[-1].buckets_used) > 2


def test_greedy_tokens_do_not_depend_on_how_often_the_host_checks(decoders):
    """sync_every > 1 (a GPU's default) moves only the compactions: greedy tokens, lengths and
    finish reasons stay; sampled rows still stop at their first stop token."""
    model = tiny("llama")
    greedy = SamplingParams(n=2, temperature=0, max_new_tokens=16, stop_token_ids=list(range(100, 190)))
    ref = EmbeddedEngine(model).generate(PROMPTS, greedy)
    assert len({len(c.token_ids) for c in ref}) > 1
    for every in (3, 32):
        out = EmbeddedEngine(model, static_decode="fixed", sync_every=every).generate(PROMPTS, greedy)
        assert [(c.token_ids, c.finish_reason) for c in out] == [(c.token_ids, c.finish_reason) for c in ref]
    assert decoders[-1].buckets_used == [8]  # every 32 > 16 steps: the host never looked, never compacted
    stops = set(STOPPING.stop_token_ids)
    for c in EmbeddedEngine(model, static_decode="fixed", sync_every=5).generate(PROMPTS, STOPPING):
        assert all(t not in stops for t in c.token_ids[:-1])
        assert (c.token_ids[-1] in stops) == (c.finish_reason == "stop")
        assert c.finish_reason == "stop" or len(c.token_ids) == STOPPING.max_new_tokens


def check_interleaving(engine: EmbeddedEngine, calls: list[tuple[list, SamplingParams]], steps: int = 3) -> None:
    """Generations advanced a few steps each in turn give what each gives alone."""
    alone = [[c.token_ids for c in engine.generate(*call)] for call in calls]
    gens = [engine.start_generation(*call) for call in calls]
    while not all(g.done for g in gens):
        for g in gens:
            g.advance(steps)
    assert [[c.token_ids for c in g.result] for g in gens] == alone


def test_interleaved_generations_get_their_own_tokens():
    """`baton serve` runs generations a few steps at a time: each keeps its buckets."""
    check_interleaving(EmbeddedEngine(tiny("qwen2"), static_decode="fixed"), [(PROMPTS, STOPPING), (PROMPTS[:2], SAMPLED)])


def test_unfilled_cache_slots_cannot_poison_the_fixed_step():
    """The fixed step attends over every slot: garbage (here NaN) in the slots not yet
    written would reach each row through 0 * NaN unless the decoder zeroes them."""
    model = tiny("qwen2")
    engine = EmbeddedEngine(model)
    runner = engine.runner
    ids, mask = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    with torch.inference_mode():
        runner.pack()
        runner.start(ids, mask, max_new=4, n=1)
        for kc, vc in runner.cache:
            kc[:, :, 3:], vc[:, :, 3:] = float("nan"), float("nan")
        logits = StaticDecoder(runner, 2, "fixed").decode(torch.tensor([10, 11]))
    assert torch.isfinite(logits).all()


def test_one_pass_prefill_matches_the_chunked_one(monkeypatch):
    """On a GPU the prompts are prefilled in one padded pass, not in chunks of similar length."""
    model = tiny("qwen2")
    runner = EmbeddedEngine(model).runner
    chunks = []
    prefill = runner._prefill
    monkeypatch.setattr(runner, "_prefill", lambda ids, *a: (chunks.append(ids.shape), prefill(ids, *a))[1])
    prompts = [[5] * 2, [6] * 3, [7] * 20, [8] * 21]  # two chunks by length, one pass padded
    ids = torch.zeros(4, 21, dtype=torch.long)
    mask = torch.zeros(4, 21, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, 21 - len(p):], mask[i, 21 - len(p):] = torch.tensor(p), 1
    with torch.inference_mode():
        runner.pack()
        chunked = runner.start(ids, mask, max_new=2, n=1)
        cache = [kc.clone() for kc, _ in runner.cache]
        one = runner.start(ids, mask, max_new=2, n=1, one_pass=True)
    assert chunks == [(2, 3), (2, 21), (4, 21)]  # chunked: by length; one pass: all of them
    torch.testing.assert_close(one, chunked, atol=1e-5, rtol=0)
    real = slice(21 - 2, 21)  # the slots where every prompt has a real token
    for c, (kc, _) in zip(cache, runner.cache):
        torch.testing.assert_close(kc[:, :, real], c[:, :, real])


def test_static_decode_options_are_checked():
    from transformers import GPT2Config, GPT2LMHeadModel
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=64))
    with pytest.raises(ValueError, match="fast decoder path"):
        EmbeddedEngine(gpt2, static_decode=True)
    with pytest.raises(ValueError, match="static_decode must be"):
        EmbeddedEngine(tiny(), static_decode="graphs")
    with pytest.raises(ValueError, match="sync_every"):
        EmbeddedEngine(tiny(), sync_every=0)
    assert EmbeddedEngine(tiny())._static_step(torch.device("cpu")) is None  # CPU default: as before
    assert EmbeddedEngine(tiny())._static_step(torch.device("cuda")) == "graph"


@pytest.mark.parametrize("params", [
    SamplingParams(n=3, temperature=0.7, top_k=20, max_new_tokens=12, seed=2),
    SamplingParams(n=3, temperature=1.0, top_p=0.8, max_new_tokens=12, seed=3, stop_token_ids=list(range(100, 130))),
    SamplingParams(n=3, temperature=1.3, min_p=0.1, max_new_tokens=12, seed=4),
    SamplingParams(n=3, temperature=0, max_new_tokens=12, stop_token_ids=list(range(100, 130))),
], ids=["top_k", "top_p", "min_p", "greedy"])
def test_the_step_samples_as_the_loop_does(params, decoders):
    """The static step samples inside itself (in its CUDA graph on a GPU) with the draws the
    loop takes for its logical rows: the loop's own sampling's tokens, every filter."""
    model = tiny("llama")
    ref = EmbeddedEngine(model).generate(PROMPTS, params)
    out = EmbeddedEngine(model, static_decode="fixed").generate(PROMPTS, params)
    assert decoders[-1].sampling is params
    assert [(c.token_ids, c.finish_reason) for c in out] == [(c.token_ids, c.finish_reason) for c in ref]
    torch.testing.assert_close(torch.tensor([x for c in out for x in c.logprobs]),
                               torch.tensor([x for c in ref for x in c.logprobs]), atol=1e-5, rtol=0)


def test_attention_reads_the_filled_slots_in_length_buckets(decoders):
    """80 new tokens: a 128-slot arena, attended over 64 slots until they fill, then 128: the
    default path's tokens, logprobs to rounding, one step per (rows, length) bucket."""
    model = tiny("qwen2")
    params = SamplingParams(n=2, temperature=0.9, max_new_tokens=80, seed=5, ignore_eos=True)
    ref = EmbeddedEngine(model).generate(PROMPTS, params)
    engine = EmbeddedEngine(model, static_decode="fixed")
    out = engine.generate(PROMPTS, params)
    assert decoders[-1].arena is None and engine.graphs.idle[0].length == 128
    assert sorted(length for _, length, _ in engine.graphs.idle[0].steps) == [64, 128]
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    torch.testing.assert_close(torch.tensor([x for c in out for x in c.logprobs]),
                               torch.tensor([x for c in ref for x in c.logprobs]), atol=1e-5, rtol=0)
