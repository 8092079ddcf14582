"""Metrics are named for what they measure: the update's KL between the rows' behaviour
logprobs and the trainer's is the engine-vs-trainer mismatch only for on-policy rows; rows
sampled by older weights (a generator ahead) add the policy's change since and are logged as
`rollout/behaviour_kl` instead (baton.trainers.report.step_metrics.name_mismatch)."""

from baton.trainers.report.step_metrics import BEHAVIOUR, MISMATCH, name_mismatch


def test_on_policy_rows_keep_the_mismatch_name():
    assert name_mismatch({MISMATCH: 1e-9, "rollout/policy_age": 0.0}) == {MISMATCH: 1e-9, "rollout/policy_age": 0.0}


def test_rows_one_version_old_are_the_behaviour_kl():
    m = name_mismatch({MISMATCH: 0.02, "rollout/policy_age": 1.0})
    assert m == {BEHAVIOUR: 0.02, "rollout/policy_age": 1.0} and MISMATCH not in m


def test_a_step_without_the_figure_is_left_alone():
    assert name_mismatch({"rollout/policy_age": 1.0}) == {"rollout/policy_age": 1.0}
