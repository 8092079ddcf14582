"""Controller tests on a real Ray instance with real gloo process groups (2-4 workers)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from ctl_workers import Actor, EchoWorker, Ref, Reward

from baton.batch import Batch
from baton.controller import ResourcePool, WorkerError, WorkerGroup, build_role_groups
from baton.controller.ray_backend import RayFuture

pytestmark = pytest.mark.ray  # the session's Ray instance (tests/conftest.py)


@pytest.fixture(scope="module")
def g2(ray_cluster):
    g = WorkerGroup(ResourcePool(2, backend="ray", name="g2"), EchoWorker, scale=1.0)
    yield g
    g.shutdown()


@pytest.fixture(scope="module")
def g1(ray_cluster):
    g = WorkerGroup(ResourcePool(1, backend="ray", name="g1"), EchoWorker, scale=10.0)
    yield g
    g.shutdown()


def _batch(n: int) -> Batch:
    return Batch({"x": torch.arange(float(n)).unsqueeze(1)}, {"tag": [f"r{i}" for i in range(n)]})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_one_to_all_all_to_all_rank_zero(g2):
    infos = g2.info()
    assert [i["rank"] for i in infos] == [0, 1] and all(i["init_world"] == 2 for i in infos)
    assert len({i["pid"] for i in infos} | {os.getpid()}) == 3  # two worker processes, not the driver
    assert g2.add(1, y=2) == [3, 4]
    assert g2.times_rank([5, 7]) == [5, 14]
    assert g2.only_zero(3) == (0, 3)
    with pytest.raises(ValueError, match="ALL_TO_ALL"):
        g2.times_rank([1, 2, 3])


def test_all_reduce_inside_worker(g2):
    assert g2.all_reduce_rank() == [3.0, 3.0]


def test_dp_compute_uneven_batch_keeps_order(g2):
    out = g2.double(_batch(5))  # 5 rows on 2 ranks: 3 + 3 with one padding row, 5 back
    assert out["x"].flatten().tolist() == [0, 2, 4, 6, 8]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1]
    assert list(out["tag"]) == [f"r{i}!" for i in range(5)]
    assert "_pad" not in out.meta
    # Non-Batch results: one per dp rank; a list of dp_size elements is split, others replicated.
    assert g2.count(_batch(4), ["a", "b"]) == [(2, "a"), (2, "b")]
    assert g2.count(_batch(4), ("a", "b")) == [(2, ("a", "b"))] * 2


def test_future_passed_between_groups_without_driver_fetch(g2, g1, monkeypatch):
    fut = g2.double_async(_batch(5))
    assert isinstance(fut, RayFuture)

    def no_fetch(self, timeout=None):
        raise AssertionError("the driver fetched a future's data")

    with monkeypatch.context() as m:
        m.setattr(RayFuture, "get", no_fetch)
        same_dp = g2.double_async(fut)  # same dp layout: rank refs handed on
        other_dp = g1.double_async(fut)  # 2 -> 1 dp ranks: re-split on the cluster
    assert same_dp.get()["x"].flatten().tolist() == [0, 4, 8, 12, 16]
    assert other_dp.get()["x"].flatten().tolist() == [0, 40, 80, 120, 160]
    assert g2.total(fut) == [20.0, 20.0]  # ONE_TO_ALL of a DP result: collected on the cluster
    assert fut.done()


def test_colocated_roles_and_split_pools_run_concurrently(g2, g1):
    """...and each host's call log shows it: per rank, with the rank's pid."""
    # Reuse the processes of g2 / g1 (starting workers dominates test time): roles added to
    # a pool that already runs are colocated with what it hosts.
    groups = build_role_groups(pools={"main": g2.pool, "aux": g1.pool},
                               roles={"actor": "main", "ref": "main", "reward": "aux"},
                               classes={"actor": (Actor, (3,)), "ref": Ref, "reward": Reward},
                               backend="ray")
    try:
        actor, ref, reward = groups["actor"], groups["ref"], groups["reward"]
        # Colocated: one process per slot hosts both roles, the sibling is read in place.
        assert actor.pid() == ref.pid() == [i["pid"] for i in g2.info()]
        assert set(reward.pid()).isdisjoint(actor.pid())
        actor.bump()
        assert ref.read_actor() == [([1.0, 2.0, 3.0], True)] * 2
        assert "not colocated" in ref.try_sibling("reward")[0]
        t0 = time.perf_counter()
        a, r = actor.sleep(1.0), reward.sleep(1.0)
        assert a.get() == [1.0, 1.0] and r.get() == [1.0]
        elapsed = time.perf_counter() - t0
        assert elapsed < 1.7, f"split pools did not overlap: {elapsed:.2f} s for two 1 s sleeps"
        la, lr = actor.call_log(), reward.call_log()
        assert "read_actor" not in [c["method"] for c in la]  # a colocated role's calls are its own
        sleeps = [c for c in la if c["method"] == "sleep"]
        (rec,) = [c for c in lr if c["method"] == "sleep"]
        assert sorted(c["rank"] for c in sleeps) == [0, 1] and {c["pid"] for c in sleeps} == set(actor.pid())
        overlap = min(rec["end"], *(c["end"] for c in sleeps)) - max(rec["start"], *(c["start"] for c in sleeps))
        assert overlap > 0.3, overlap  # two 1 s sleeps within 1.7 s overlap by 0.3 s at least
    finally:
        for g in groups.values():
            g.shutdown()
    assert g2.pool.roles == ["EchoWorker"] and g2.add(0) == [0, 1]  # the pool lives on


def test_tp_peers_get_the_same_chunk_then_an_exception_breaks_the_group():
    g = WorkerGroup(ResourcePool(4, backend="ray", mesh=(2, 1, 2), name="tp"), EchoWorker)
    try:
        infos = g.info()
        assert [(i["dp_rank"], i["tp_rank"], i["mesh_tp"]) for i in infos] == \
            [(0, 0, 0), (0, 1, 1), (1, 0, 0), (1, 1, 1)]
        out = g.double(_batch(5))
        assert out["x"].flatten().tolist() == [0, 2, 4, 6, 8]
        assert out["rank"].tolist() == [0, 0, 0, 2, 2]  # only tp_rank 0 of each dp group collected
        assert g.last_rows() == [[0, 1, 2], [0, 1, 2], [3, 4, 0], [3, 4, 0]]

        # An exception in one rank: a WorkerError naming class, rank, method, remote traceback.
        with pytest.raises(WorkerError) as info:
            g.fail_on(1)
        msg = str(info.value)
        assert "EchoWorker rank 1 failed in fail_on()" in msg
        assert "bad value on purpose in rank 1" in msg and "Traceback" in msg and "ctl_workers.py" in msg
        assert (info.value.rank, info.value.method) == (1, "fail_on")
        assert g.broken
        t0 = time.perf_counter()
        with pytest.raises(WorkerError, match="broken by an earlier failure"):
            g.add(1)
        assert time.perf_counter() - t0 < 1.0
    finally:
        g.shutdown()


def test_killed_worker_in_collective_is_an_error_not_a_hang():
    g = WorkerGroup(ResourcePool(2, backend="ray", name="kill"), EchoWorker)
    pids = [i["pid"] for i in g.info()]
    try:
        fut = g.collective_after([0.0, 60.0])  # rank 0 enters the all-reduce at once ...
        time.sleep(0.5)
        assert not fut.done()  # ... and waits for rank 1, which is still sleeping: kill it
        t0 = time.perf_counter()
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(WorkerError, match="died") as info:
            fut.get()
        assert time.perf_counter() - t0 < 30
        assert info.value.rank == 1 and info.value.method == "collective_after"
        t0 = time.perf_counter()
        with pytest.raises(WorkerError, match="broken"):
            g.add(1)
        assert time.perf_counter() - t0 < 1.0
    finally:
        g.shutdown()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "worker processes left behind after shutdown()"


def test_placement_timeout_is_clear():
    pool = ResourcePool(1, backend="ray", cpus_per_worker=64, ready_timeout_s=1.0, name="huge")
    with pytest.raises(RuntimeError, match="not placed within"):
        WorkerGroup(pool, Reward)


def test_a_killed_worker_is_named_by_its_class_when_its_call_log_is_taken():
    """Issue 50.10: a SIGKILLed teacher worker was named "Host rank 0 in take_call_log()" (the
    driver takes each role's call log after a step): the role's class is named."""
    g = WorkerGroup(ResourcePool(1, backend="ray", name="kill-log"), EchoWorker)
    pid = g.info()[0]["pid"]
    try:
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match="died") as info:
            g.call_log()
        assert info.value.worker_cls == "EchoWorker" and info.value.method == "call_log", info.value
    finally:
        g.shutdown()
