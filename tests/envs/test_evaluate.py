"""`evaluate` over the engine protocol, with a scripted fake engine."""

import logging
import time

import pytest

from baton.envs import ArithmeticTask
from baton.envs.evaluate import TaskScorer, evaluate, evaluate_modes
from baton.models import build_char_tokenizer
from baton.protocol import Completion, Engine


class ScriptedEngine(Engine):
    """Answers the first `right` prompts correctly, the rest wrongly; records the params."""

    version = 0

    def __init__(self, tok, rows, right, finish="stop"):
        self.tok, self.rows, self.right, self.finish, self.params = tok, rows, right, finish, None

    def generate(self, prompts, params):
        self.params = params
        out = []
        for i, ids in enumerate(prompts):
            assert self.tok.decode(ids) == self.rows[i]["prompt"]
            text = self.rows[i]["answer"] if i < self.right else "x"
            for _ in range(params.n):
                out.append(Completion(i, self.tok(text)["input_ids"] + [self.tok.eos_token_id], [0.0], self.finish, 0))
        return out

    def update_weights(self, weights, version): ...
    def sleep(self): ...
    def wake(self): ...


@pytest.fixture
def setup():
    tok = build_char_tokenizer()
    task = ArithmeticTask()
    return tok, task, task.eval_rows(10)


def test_greedy_and_sampled_accuracy(setup):
    tok, task, rows = setup
    eng = ScriptedEngine(tok, rows, right=3)
    res = evaluate(eng, tok, task, rows, greedy=True, n=4)
    assert res == {"accuracy": 0.3, "stop_rate": 1.0, "samples": 10.0, "timeouts": 0.0, "errors": 0.0}
    assert eng.params.temperature == 0.0 and eng.params.n == 1
    res = evaluate(eng, tok, task, rows, greedy=False, n=4, seed=7)
    assert res["accuracy"] == pytest.approx(0.3) and res["samples"] == 40
    assert eng.params.temperature == 1.0 and eng.params.n == 4 and eng.params.seed == 7


def test_truncated_completions_count_as_wrong(setup):
    tok, task, rows = setup
    res = evaluate(ScriptedEngine(tok, rows, right=10, finish="length"), tok, task, rows, greedy=True)
    assert res["accuracy"] == 0.0 and res["stop_rate"] == 0.0


class FaultyTask(ArithmeticTask):
    """Arithmetic, but the verifier hangs on row 0's answer and raises on row 1's (a
    verifiers reward stuck in a loop, a scorer with a bug). A module-level class: a reward
    worker process loads it (this file) by reference."""

    def is_correct(self, completion, row):
        if row["prompt"] == HANG:
            time.sleep(3600)
        if row["prompt"] == RAISE:
            raise RuntimeError("scorer bug")
        return super().is_correct(completion, row)


HANG, RAISE = ArithmeticTask().eval_rows(2)[0]["prompt"], ArithmeticTask().eval_rows(2)[1]["prompt"]


def test_a_verifier_that_hangs_or_raises_is_scored_wrong_counted_and_said(setup, caplog):
    """Issue 50.1: evaluation's verifier runs in the reward runner, under its deadline."""
    tok, _, rows = setup
    task = FaultyTask()
    scorer = TaskScorer(task, timeout_s=1.0, max_workers=2)
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="baton.rewards.runner"):
            res = evaluate(ScriptedEngine(tok, rows, right=10), tok, task, rows, greedy=True, scorer=scorer)
        assert time.monotonic() - t0 < 30  # not the hour the hung call asks for
    finally:
        scorer.close()
    assert scorer.runner.sandbox == "process"  # the hung call is SIGKILLed, not left running
    assert res["timeouts"] == 1 and res["errors"] == 1 and res["accuracy"] == pytest.approx(0.8)
    said = [r.getMessage() for r in caplog.records]
    assert any("deadline" in m and "timeouts: 1" in m for m in said)
    assert any("scorer bug" in m and "errors: 1" in m for m in said)


def test_evaluate_modes_reports_the_verifier_counts(setup):
    tok, task, rows = setup
    res = evaluate_modes(ScriptedEngine(tok, rows, right=3), tok, task, rows, n=2)
    assert res["eval/timeouts"] == 0 and res["eval/errors"] == 0 and res["eval/accuracy_greedy"] == 0.3
