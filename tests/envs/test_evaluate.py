"""`evaluate` over the engine protocol, with a scripted fake engine."""

import pytest

from baton.envs import ArithmeticTask
from baton.envs.evaluate import evaluate
from baton.models import build_char_tokenizer
from baton.rollout.protocol import Completion


class ScriptedEngine:
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
    assert res == {"accuracy": 0.3, "stop_rate": 1.0, "samples": 10.0}
    assert eng.params.temperature == 0.0 and eng.params.n == 1
    res = evaluate(eng, tok, task, rows, greedy=False, n=4, seed=7)
    assert res["accuracy"] == pytest.approx(0.3) and res["samples"] == 40
    assert eng.params.temperature == 1.0 and eng.params.n == 4 and eng.params.seed == 7


def test_truncated_completions_count_as_wrong(setup):
    tok, task, rows = setup
    res = evaluate(ScriptedEngine(tok, rows, right=10, finish="length"), tok, task, rows, greedy=True)
    assert res["accuracy"] == 0.0 and res["stop_rate"] == 0.0
