"""Host syncs a decode token: the engine reads device values only at its looks (every
`sync_every` steps), stop strings included (`StopStringMatcher.push_block` over the tokens
since the last look, one read), and cuts every row where its text first held a stop string,
as a look every step does. Host reads of device tensors are counted with
tests/device_fault_mode.py (the engine on a device of its own, cpu:1)."""

import pytest
import torch

from baton.models.tokenizer import build_char_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from baton.rollout.embedded.stop_strings import StopStringMatcher
from tests.device_fault_mode import WORKER, DeviceFaultMode
from tests.rollout.test_static_decode import tiny

TOK = build_char_tokenizer()
PROMPTS = [TOK(p)["input_ids"] for p in ("12+3=", "7*8=", "100-1=", "2")]


def ids(text: str) -> list[int]:
    return TOK(text)["input_ids"]


def test_push_block_by_hand():
    m = StopStringMatcher(TOK, ["cd", ""], rows=3)
    # row 0: "abc" holds no "cd"; then "de": "cd" complete at the block's first token
    assert m.push_block([0, 2], [ids("abc"), ids("xcdx")]) == [None, 2]
    assert m.push_block([0, 2], [ids("de"), ids("cd")]) == [0, None]  # row 2 already stopped
    assert m.tokens[0] == ids("abcde")
    assert m.push_block([1], [[]]) == [None]


def outputs(engine: EmbeddedEngine, params: SamplingParams):
    out = engine.generate(PROMPTS, params)
    return [(c.token_ids, c.finish_reason) for c in out], torch.tensor([lp for c in out for lp in c.logprobs])


@pytest.mark.parametrize("static", [None, "fixed"])
def test_looks_every_k_cut_where_every_step_does(static):
    """Greedy: the same tokens, stop positions and finish reasons whether the host looks every
    step (the old path) or every 3 / 8 steps; logprobs to rounding (a compaction moved changes
    a matmul's row count). Sampled: each row ends at its text's first stop string."""
    model = tiny("qwen2")
    free = EmbeddedEngine(model, TOK).generate(PROMPTS, SamplingParams(n=2, temperature=0, max_new_tokens=16,
                                                                      ignore_eos=True))
    texts = [TOK.decode(c.token_ids) for c in free][::2]  # one per prompt (greedy: its 2 rows agree)
    # a 2-character string from 3 of the 4 prompts' texts, from different places (no partial-byte U+FFFD)
    stop = [next(t[i:i + 2] for i in range(start, len(t) - 1) if "\ufffd" not in t[i:i + 2])
            for t, start in zip(texts[:3], (9, 2, 5))]
    greedy = SamplingParams(n=2, temperature=0, max_new_tokens=16, stop=stop, ignore_eos=True)
    want, want_lp = outputs(EmbeddedEngine(model, TOK, static_decode=static, sync_every=1), greedy)
    cut = sorted({len(t) for t, r in want if r == "stop"})
    assert len(cut) > 1 and {r for _, r in want} == {"stop", "length"}  # rows stop at different steps
    for every in (3, 8):
        got, got_lp = outputs(EmbeddedEngine(model, TOK, static_decode=static, sync_every=every), greedy)
        assert got == want
        torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=0)
    sampled = SamplingParams(n=3, temperature=1.0, max_new_tokens=16, seed=4, stop=["1", "="])
    for c in EmbeddedEngine(model, TOK, static_decode=static, sync_every=5).generate(PROMPTS, sampled):
        text = TOK.decode(c.token_ids)
        held = [i for i in range(1, len(c.token_ids) + 1) if any(s in TOK.decode(c.token_ids[:i]) for s in sampled.stop)]
        assert (c.finish_reason == "stop") == bool(held)
        assert not held or held[0] == len(c.token_ids), text  # cut right after its first stop string


def host_reads(engine: EmbeddedEngine, mode: DeviceFaultMode, params: SamplingParams) -> int:
    mode.reads.clear()
    with mode.in_region("generate"):
        engine.generate(PROMPTS, params)
    return mode.reads["generate"]


@pytest.mark.parametrize("stops", [dict(ignore_eos=True), dict(), dict(stop=["zz", "q"])],
                         ids=["no-stops", "eos", "stop-strings"])
def test_host_reads_per_token(stops):
    """On a device (cpu:1 under DeviceFaultMode), as a GPU decodes (static steps, a look every
    8): no stop condition, no read a token; EOS or stop strings, one read per 8 steps (a stop
    string used to cost a read every step, two with the finished rows' count)."""
    k = 8
    mode = DeviceFaultMode()
    with mode:
        engine = EmbeddedEngine(tiny("qwen2").to(WORKER), TOK, static_decode=True, sync_every=k)
        reads = {n: host_reads(engine, mode, SamplingParams(n=2, temperature=1.0, seed=0, max_new_tokens=n, **stops))
                 for n in (16, 32)}
    per_step = (reads[32] - reads[16]) / 16  # the per-call reads (prefill, completions) cancel
    assert per_step == (0 if "ignore_eos" in stops else 1 / k), reads
