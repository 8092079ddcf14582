"""The admission schedule of GeneratorSource, against a stand-in generator that runs calls in
the order they are submitted (as a worker process does): no processes, milliseconds."""

import pytest
import torch

from baton import fields as F
from baton.batch import Batch
from baton.controller import LocalFuture
from baton.sources.ahead import GeneratorSource
from baton.data.prompts import PromptSampler
from baton.trainers.session.state import RunState


def run_state():
    """30 rows (prompts "0+0=" ... "29+0="), shuffled by a seeded sampler: enough to see order."""
    rows = [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(30)]
    return RunState(sampler=PromptSampler(rows, seed=0), eval_rows=[])


class FakeGenerator:
    """Calls run at submission: load_weights sets the version that later generates report."""

    def __init__(self):
        self.version, self.calls = 0, []

    def submit(self, method, *args):
        if method == "load_weights":
            self.version = args[1]
            self.calls.append(("push", args[1]))
            return LocalFuture(args[1])
        prompts, step = args
        self.calls.append(("generate", step))
        return LocalFuture(Batch({F.POLICY_VERSION: torch.full((len(prompts),), self.version)},
                                 {F.PROMPT_TEXT: list(prompts[F.PROMPT_TEXT])}))


class FakeWeights:
    def submit(self, method):
        return LocalFuture({})


def drive(source, first, last, *, on_step=None):
    """What the driver does: rows of the step, (an update), the new weights."""
    out = {}
    for step in range(first, last + 1):
        rows = source.rows(step)
        out[step] = (rows[F.POLICY_VERSION].unique().tolist(), list(rows[F.PROMPT_TEXT]))
        if on_step:
            on_step(step)
        source.weights_updated(step)
    return out


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_rows_of_step_s_are_sampled_by_version_s_minus_1_minus_k(k):
    gen, state = FakeGenerator(), run_state()
    source = GeneratorSource(gen, FakeWeights(), state, 4, max_staleness=k, total_steps=12)
    ahead = []
    out = drive(source, 1, 12, on_step=lambda s: ahead.append(len(source.admitted)))
    assert {s: v for s, (v, _) in out.items()} == {s: [max(0, s - 1 - k)] for s in range(1, 13)}
    assert max(ahead) == k  # never more than k steps sampled ahead of the one being trained
    assert [c for c in gen.calls if c[0] == "generate"] == [("generate", s) for s in range(1, 13)]  # none dropped
    # admission: generate(s) is submitted only after the push of version s - 1 - k
    for i, (kind, s) in enumerate(gen.calls):
        if kind == "generate" and s - 1 - k > 0:
            assert ("push", s - 1 - k) in gen.calls[:i]


@pytest.mark.parametrize("k", [1, 2])
def test_a_resumed_source_continues_with_the_same_rows_and_versions(k):
    def fresh():
        state = run_state()
        return state, GeneratorSource(FakeGenerator(), FakeWeights(), state, 4, max_staleness=k, total_steps=10)

    _, source = fresh()
    full = drive(source, 1, 10)
    state, source = fresh()
    drive(source, 1, 6)
    saved = {"sampler": state.sampler.state_dict(), "source": source.state_dict()}
    state, source = fresh()  # a new process: a generator holding only what it loaded
    state.sampler.load_state_dict(saved["sampler"])
    source.load_state_dict(saved["source"])
    source.weights_updated(6)  # the driver pushes the checkpoint's weights
    assert drive(source, 7, 10) == {s: full[s] for s in range(7, 11)}


def test_a_step_never_admitted_is_an_error_not_a_hang():
    source = GeneratorSource(FakeGenerator(), FakeWeights(), run_state(), 4,
                             max_staleness=1, total_steps=10)
    with pytest.raises(RuntimeError, match="step 5 was never admitted"):
        source.rows(5)
