"""The real-model recipe's task (baton/envs/chat_arithmetic.py): chat-message rows, the
last-integer verifier (hand-worked cases), and held-out problems that are distinct and never
trained on."""

from __future__ import annotations

import pytest

from baton.envs import TASKS
from baton.envs.chat_arithmetic import ChatArithmeticTask, correctness, final_integer
from baton.rewards.runner import REWARD_FUNCTIONS


@pytest.mark.parametrize("text, value", [
    ("7 + 15 = 22.", 22),                     # the direct answer
    ("The sum of 7 and 15 is 22", 22),        # prose: the last integer
    ("7 + 15 = 22, so the answer is 23", 23),  # a correction counts, the first number does not
    ("1,234", 1234),                          # thousands separators
    ("-3", -3),
    ("no number here", None),
])
def test_final_integer(text, value):
    assert final_integer(text) == value


def test_rows_are_chat_messages_scored_by_the_last_integer():
    task = TASKS["chat_arithmetic"]
    row = task.train_rows(1, seed=0)[0]
    assert row == {"prompt": [{"role": "user", "content": "What is 29 + 25?"}], "answer": "54"}
    assert task.is_correct("29 + 25 = 54.", row) and not task.is_correct("29 + 25 = 55.", row)
    assert REWARD_FUNCTIONS["chat_arithmetic/correct"] is correctness
    assert correctness(row["prompt"], "It is 14", answer="14") == 1.0
    assert correctness(row["prompt"], "It is 41", answer="14") == 0.0
    assert task.reward_weights == {"chat_arithmetic/correct": 1.0}


def test_heldout_problems_are_distinct_and_never_trained_on():
    task = TASKS["chat_arithmetic"]
    heldout = [r["prompt"][0]["content"] for r in task.eval_rows(200)]
    assert len(set(heldout)) == 200
    trained = {r["prompt"][0]["content"] for r in task.train_rows(5000, seed=3)}
    assert not trained & set(heldout)


def test_too_few_heldout_problems_is_said():
    with pytest.raises(ValueError, match="distinct held-out problems, fewer than the 50 asked"):
        ChatArithmeticTask(max_value=5).eval_rows(50)  # 36 sums, ~9 held out
