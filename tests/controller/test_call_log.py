"""The host records every driver call (role, method, rank, start, end) and `WorkerGroup.submit`
runs any registered method without waiting: the two pieces a driver uses to run updates of
two roles at the same time and to show that they did."""

from __future__ import annotations

import os

import pytest
from ctl_workers import Actor, EchoWorker, Reward

from baton.controller import ResourcePool, WorkerGroup, build_role_groups, ensure_ray, shutdown_ray


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


@pytest.mark.ray
def test_ray_calls_on_two_pools_overlap_in_the_log():
    here = os.path.dirname(os.path.abspath(__file__))
    ensure_ray(num_cpus=4, runtime_env={"env_vars": {"PYTHONPATH": here}})
    try:
        roles = build_role_groups({"main": 2, "aux": 1}, {"actor": "main", "reward": "aux"},
                                  {"actor": Actor, "reward": Reward}, backend="ray")
        a, r = roles["actor"].sleep(0.5), roles["reward"].sleep(0.5)  # both in flight
        a.get(), r.get()
        la, lr = roles["actor"].call_log(), roles["reward"].call_log()
        assert sorted(c["rank"] for c in la) == [0, 1] and len({c["pid"] for c in la}) == 2
        (rec,) = lr
        overlap = min(rec["end"], *(c["end"] for c in la)) - max(rec["start"], *(c["start"] for c in la))
        assert overlap > 0.3, overlap
        for g in roles.values():
            g.shutdown()
    finally:
        shutdown_ray()
