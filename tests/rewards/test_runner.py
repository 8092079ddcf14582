"""Reward functions: weights, and a function that raises or hangs is reported, not fatal."""

import time

import pytest

from baton.rewards.runner import RewardRunner, register_reward, resolve_reward


@register_reward("test/len")
def _length(prompt, completion, **row):
    return float(len(completion))


@register_reward("test/match")
def _match(prompt, completion, answer, **row):
    return float(completion == answer)


@register_reward("test/raises")
def _raises(prompt, completion, **row):
    if completion == "bad":
        raise RuntimeError("verifier bug")
    return 1.0


@register_reward("test/hangs")
def _hangs(prompt, completion, **row):
    if completion == "slow":
        time.sleep(30)
    return 1.0


def test_weighted_sum_and_row_fields():
    runner = RewardRunner({"test/len": 0.5, "test/match": 2.0})
    totals, per_fn, stats = runner.score(["p", "p"], ["ab", "x"], [{"answer": "ab"}, {"answer": "y"}])
    assert per_fn == {"test/len": [2.0, 1.0], "test/match": [1.0, 0.0]}
    assert totals == [0.5 * 2 + 2.0 * 1, 0.5 * 1 + 0.0]
    assert stats.errors == [0, 0] and stats.timeouts == [0, 0]


def test_raising_function_scores_zero_and_is_counted():
    totals, _, stats = RewardRunner({"test/raises": 1.0}).score(["p"] * 3, ["ok", "bad", "ok"], [{}] * 3)
    assert totals == [1.0, 0.0, 1.0] and stats.errors == [0, 1, 0]


def test_hanging_function_times_out():
    runner = RewardRunner({"test/hangs": 1.0}, timeout_s=2.0, max_workers=2)
    assert runner.score(["p"], ["ok"], [{}])[0] == [1.0]  # workers up (slow to start on a loaded machine)
    start = time.perf_counter()
    totals, _, stats = runner.score(["p"] * 3, ["ok", "slow", "ok"], [{}] * 3)
    # bounded by the timeout, not the 30 s hang (generous: the machine may be loaded)
    assert time.perf_counter() - start < 15.0
    assert totals == [1.0, 0.0, 1.0] and stats.timeouts == [0, 1, 0]
    totals, _, _ = runner.score(["p"], ["ok"], [{}])  # the runner still works afterwards
    assert totals == [1.0]


def test_unknown_function_and_import_path():
    with pytest.raises(ValueError, match="unknown reward function 'nope'"):
        resolve_reward("nope")
    assert resolve_reward("os.path:basename")("a/b") == "b"


_PREPARED: list[int] = []  # pids of the processes where _prepared's prepare() ran


@register_reward("test/prepared")
def _prepared(prompt, completion, **row):
    """1 where prepare() ran in this process before the call (e.g. a slow import done)."""
    import os

    return float(os.getpid() in _PREPARED)


_prepared.prepare = lambda: _PREPARED.append(__import__("os").getpid())


@pytest.mark.parametrize("sandbox", ["process", "thread"])
def test_prepare_runs_where_functions_load_not_in_calls(sandbox):
    """A function's prepare() (verifiers/reward: verifiers' import, seconds) runs once as a
    worker loads it (thread sandbox: as the runner is built), before any call and its deadline."""
    runner = RewardRunner({"test/prepared": 1.0}, max_workers=2, sandbox=sandbox)
    totals, _, stats = runner.score(["p"] * 4, ["a"] * 4, [{}] * 4)
    assert totals == [1.0] * 4 and stats.errors == [0] * 4
    runner.close()
