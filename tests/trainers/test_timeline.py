"""The timeline's overlap measure, by hand: the fraction of the shorter call that ran while
the other did, each call's span taken over all its ranks."""

import pytest

from baton.trainers.session import timeline


def rec(role, method, rank, start, end):
    return {"role": role, "method": method, "rank": rank, "pid": rank, "start": start, "end": end}


def test_overlap_by_hand():
    assert timeline.overlap((0.0, 4.0), (1.0, 3.0)) == 1.0  # the shorter runs inside the longer
    assert timeline.overlap((0.0, 4.0), (3.0, 5.0)) == 0.5  # 1 s of the 2 s call
    assert timeline.overlap((0.0, 1.0), (1.0, 2.0)) == 0.0  # back to back
    assert timeline.overlap((0.0, 1.0), None) is None


def test_spans_cover_every_rank_and_step_overlaps():
    recs = [rec("actor", "update", 0, 10.0, 14.0), rec("actor", "update", 1, 10.5, 15.0),
            rec("critic", "update_critic", 0, 12.0, 17.0),
            rec("critic", "compute_values", 0, 1.0, 2.0), rec("reward", "compute_rewards", 0, 1.5, 1.7)]
    assert timeline.span(recs, "actor", "update") == (10.0, 15.0)
    # actor 10..15 (5 s), critic 12..17 (5 s): 3 s together -> 0.6
    got = timeline.step_overlaps(recs)
    assert got == {"timeline/update_overlap": pytest.approx(0.6), "timeline/values_reward_overlap": 1.0}


def test_truncate_after_drops_later_steps_and_a_torn_line(tmp_path):
    path = tmp_path / "timeline.jsonl"
    for step in (1, 2, 3):
        timeline.append(path, step, [rec("actor", "update", 0, step, step + 0.5)])
    with open(path, "a") as f:
        f.write('{"step": 4, "ro')
    timeline.truncate_after(path, 2)
    assert [r["step"] for r in timeline.read(path)] == [1, 2]
