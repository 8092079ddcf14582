"""Stuck is as loud as dead (issue 22 §3): a SIGSTOPped worker, or a call past its deadline,
is a WorkerError naming the worker, its rank, its pid and the method it was running; when a
rank dies in a collective the dead rank is the error's cause. Real Ray worker processes."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from ctl_workers import EchoWorker

from baton.controller import ResourcePool, WorkerError, WorkerGroup
from baton.controller.ray_backend import pick_cause

pytestmark = pytest.mark.ray


def test_a_stopped_worker_is_a_named_error_not_a_silent_wait(ray_cluster):
    g = WorkerGroup(ResourcePool(2, backend="ray", name="stopped"), EchoWorker)
    pids = [i["pid"] for i in g.info()]
    # if the error never comes, the worker is resumed after 90 s and the call *returns*: the test fails, not hangs
    rescue = threading.Timer(90.0, lambda: os.kill(pids[1], signal.SIGCONT))
    try:
        fut = g.sleep(5.0)
        os.kill(pids[1], signal.SIGSTOP)
        rescue.start()
        with pytest.raises(WorkerError) as info:
            fut.get()
        msg = str(info.value)
        assert info.value.rank == 1 and info.value.method == "sleep", msg
        assert "stopped" in msg and str(pids[1]) in msg and "EchoWorker" in msg, msg
    finally:
        rescue.cancel()
        os.kill(pids[1], signal.SIGCONT)
        g.shutdown()


@pytest.mark.slow  # a pool of its own (~10 s); the stopped-worker test covers the same wait loop by default
def test_a_call_past_its_deadline_names_rank_pid_and_method(ray_cluster):
    pool = ResourcePool(2, backend="ray", name="deadline")
    pool.call_timeout_s = 2.0  # from config (trainer.call_timeout_s or the like)
    g = WorkerGroup(pool, EchoWorker)
    pids = [i["pid"] for i in g.info()]
    try:
        with pytest.raises(WorkerError) as info:
            g.sleep(60.0).get()
        msg = str(info.value)
        assert "no answer within 2 s" in msg and "sleep" in msg and str(pids[0]) in msg, msg
    finally:
        g.shutdown()


def test_the_dead_rank_is_the_cause_survivors_are_consequences():
    died = ("died", 1, "the worker process died")
    survivor = ("raised", 0, "RuntimeError: Connection closed by peer")
    cause, consequences = pick_cause([survivor, died])
    assert cause == died and consequences == [survivor]
    cause, consequences = pick_cause([survivor])
    assert cause == survivor and consequences == []
