"""The arithmetic task: exact verifier, reward functions, seeded and disjoint row sets."""

import pytest

from baton.envs import TASKS, ArithmeticTask, Task, correctness, format_reward, row_kwargs, verify
from baton.rewards.runner import REWARD_FUNCTIONS, RewardRunner


@pytest.mark.parametrize("completion, answer, ok", [
    ("49", "49", True),
    (" 49\n", "49", True),  # outer whitespace is not the model's answer
    ("49<eos>", "49", True),  # decoded without skip_special_tokens
    ("49<eos>12", "49", True),  # text after EOS is not part of the completion
    ("490", "49", False),
    ("4", "49", False),
    ("49 12", "49", False),  # trailing junk before EOS is wrong
    ("4 9", "49", False),
    ("", "49", False),
    ("-3", "-3", True),
    ("3", "-3", False),
    ("049", "49", False),  # exact, not numeric, match
])
def test_verify_cases(completion, answer, ok):
    assert verify(completion, answer) is ok
    assert correctness("1+48=", completion, answer=answer) == float(ok)


def test_format_reward():
    assert format_reward("p", "123") == 1.0
    assert format_reward("p", "-7") == 1.0
    assert format_reward("p", "12a") == 0.0
    assert format_reward("p", "") == 0.0


def test_rows_are_correct_seeded_and_disjoint():
    task = ArithmeticTask(min_terms=2, max_terms=3, ops="+-*")
    train = task.train_rows(500, seed=1)
    assert train == task.train_rows(500, seed=1)
    assert train != task.train_rows(500, seed=2)
    for r in train[:50]:
        assert r["prompt"].endswith("=") and str(eval(r["prompt"][:-1])) == r["answer"]
        assert 1 <= sum(r["prompt"].count(op) for op in "+-*") <= 2  # 2-3 terms
    held = task.eval_rows(100)
    assert held == task.eval_rows(100) and task.eval_rows(10) == held[:10]
    assert not {r["prompt"] for r in held} & {r["prompt"] for r in task.train_rows(5000, seed=3)}


def test_registry_and_reward_runner_integration():
    task = TASKS["arithmetic"]
    assert isinstance(task, Task)
    assert set(task.reward_weights) <= set(REWARD_FUNCTIONS)
    row = task.eval_rows(1)[0]
    runner = RewardRunner(task.reward_weights)
    totals, per_fn, stats = runner.score([row["prompt"]] * 2, [row["answer"], "x"], [row_kwargs(row)] * 2)
    assert totals == [pytest.approx(1.1), 0.0] and stats.errors == [0, 0]
    assert task.is_correct(task.target(row), row)


def test_bad_settings_raise():
    with pytest.raises(ValueError):
        ArithmeticTask(min_terms=3, max_terms=2)
    with pytest.raises(ValueError):
        ArithmeticTask(ops="/")
