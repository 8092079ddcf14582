"""The host records every driver call (role, method, rank, start, end) and `WorkerGroup.submit`
runs any registered method without waiting: the two pieces a driver uses to run updates of
two roles at the same time and to show that they did. On Ray (two pools, calls that overlap):
test_controller_ray.py::test_colocated_roles_and_split_pools_run_concurrently."""

from __future__ import annotations

import os

import pytest
from ctl_workers import Actor, EchoWorker, Reward

from baton.controller import ResourcePool, WorkerGroup, build_role_groups


def test_local_call_log_and_submit():
    roles = build_role_groups({"main": 1}, {"actor": "main", "reward": "main"},
                              {"actor": Actor, "reward": Reward})
    try:
        fut = roles["actor"].submit("pid")  # a blocking method, launched without waiting
        assert fut.get() == [os.getpid()]  # ONE_TO_ALL: one result per rank
        roles["reward"].sleep(0.01).get()
        log = roles["actor"].call_log()
        assert [(c["role"], c["method"], c["rank"]) for c in log] == [("actor", "pid", 0)]
        assert log[0]["end"] >= log[0]["start"]
        assert roles["actor"].call_log() == []  # taken, not copied
        (rec,) = roles["reward"].call_log()  # the colocated role's records are its own
        assert rec["method"] == "sleep" and rec["end"] - rec["start"] >= 0.01
        with pytest.raises(AttributeError, match="no registered method 'nope'"):
            roles["actor"].submit("nope")
    finally:
        for g in roles.values():
            g.shutdown()


def test_a_failing_call_is_logged_too():
    g = WorkerGroup(ResourcePool(1), EchoWorker)
    try:
        with pytest.raises(Exception, match="bad value on purpose"):
            g.fail_on(0)
        assert [c["method"] for c in g.call_log()] == ["fail_on"]
    finally:
        g.shutdown()
