"""Controller tests without Ray: dispatch functions on a topology, the local backend, and who
stops a Ray instance."""

from __future__ import annotations

import os

import pytest
import torch
from ctl_workers import Actor, EchoWorker, Ref, Reward

from baton.batch import PAD_KEY, Batch
from baton.controller import (Dispatch, Execute, LocalFuture, ResourcePool, Topology, Worker, WorkerError,
                              WorkerGroup, build_role_groups, colocated_groups, register,
                              register_dispatch_mode)
from baton.controller.dispatch import get_mode, normalize_mesh, registered_methods


def _batch(n: int) -> Batch:
    return Batch({"x": torch.arange(float(n)).unsqueeze(1)}, {"tag": [f"r{i}" for i in range(n)]})


# --- dispatch functions, no backend ----------------------------------------------------
def test_topology_tp_peers_share_chunk_and_one_is_collected():
    topo = Topology(4, (2, 1, 2))
    mode = get_mode(Dispatch.DP_COMPUTE)
    parts = mode.split(_batch(5), topo)
    assert [p["x"].flatten().tolist() for p in parts] == [[0, 1, 2], [0, 1, 2], [3, 4, 0], [3, 4, 0]]
    assert parts[0] is parts[1] and parts[2] is parts[3]
    assert [p.meta[PAD_KEY] for p in parts] == [0, 0, 1, 1]
    assert topo.collect_ranks() == [0, 2]
    # The tp_rank 1 outputs must be ignored: give them garbage.
    outs = [parts[0], "junk", parts[2], "junk"]
    assert mode.collect(outs, topo)["x"].flatten().tolist() == [0, 1, 2, 3, 4]
    assert mode.collect([1, 2, 3, 4], topo) == [1, 3]


def test_dp_split_lists_and_replication():
    topo = Topology(4, (2, 1, 2))
    split = get_mode(Dispatch.DP_COMPUTE).split
    assert split(["a", "b"], topo) == ["a", "a", "b", "b"]  # a list of dp_size: one element per dp rank
    assert split(("a", "b"), topo) == [("a", "b")] * 4  # a tuple is replicated
    assert split(7, topo) == [7] * 4


def test_fsdp_ranks_get_different_data():
    topo = Topology(4, (1, 2, 2))  # fsdp shards consume different data, like dp replicas
    assert topo.dp_size == 2 and [topo.dp_rank(r) for r in range(4)] == [0, 0, 1, 1]


def test_all_to_all_wrong_length_is_clear():
    with pytest.raises(ValueError, match="length world_size=2"):
        get_mode(Dispatch.ALL_TO_ALL).split([1, 2, 3], Topology(2, (2, 1, 1)))


def test_mesh_specs():
    assert normalize_mesh(None, 4) == (4, 1, 1)
    assert normalize_mesh({"tp": 2}, 4) == (2, 1, 2)
    with pytest.raises(ValueError, match="world size is 4"):
        normalize_mesh((2, 1, 1), 4)
    with pytest.raises(ValueError, match="unknown mesh dims"):
        normalize_mesh({"pp": 2}, 4)


def test_register_unknown_mode_fails_at_definition():
    with pytest.raises(ValueError, match="unknown dispatch mode"):
        register(dispatch="no_such_mode")


def test_registered_methods_follow_overrides():
    class Base(Worker):
        @register
        def a(self): ...

        @register
        def b(self): ...

    class Child(Base):
        def b(self): ...  # overridden without @register: no longer driver-callable

    assert set(registered_methods(Child)) == {"a"}


# --- custom dispatch mode ---------------------------------------------------------------
def _split_reversed(value, topo):
    return [value[::-1]] * topo.world_size if isinstance(value, list) else [value] * topo.world_size


def _collect_first(outputs, topo):
    return outputs[0]


REVERSED = register_dispatch_mode("test_reversed", _split_reversed, _collect_first)


class Custom(Worker):
    @register(dispatch=REVERSED)
    def echo(self, xs):
        return xs


def test_custom_dispatch_mode():
    with pytest.raises(ValueError, match="already registered"):
        register_dispatch_mode("test_reversed", _split_reversed, _collect_first)
    g = WorkerGroup(ResourcePool(1), Custom)
    assert g.echo([1, 2, 3]) == [3, 2, 1]
    g.shutdown()


# --- local backend --------------------------------------------------------------------
@pytest.fixture()
def local_group():
    g = WorkerGroup(ResourcePool(1), EchoWorker, scale=1.0)
    yield g
    g.shutdown()


def test_local_dispatch_modes(local_group):
    g = local_group
    info = g.info()[0]
    assert info["pid"] == os.getpid()  # runs in the driver: a breakpoint works
    assert (info["rank"], info["world_size"], info["init_world"]) == (0, 1, 1)
    assert info["mesh_dims"] == ("dp", "fsdp", "tp")
    assert g.add(3, y=4) == [7]
    assert g.times_rank([5]) == [5]
    assert g.only_zero(9) == (0, 9)
    assert g.all_reduce_rank() == [1.0]
    out = g.double(_batch(5))
    assert out["x"].flatten().tolist() == [0, 2, 4, 6, 8] and list(out["tag"]) == [f"r{i}!" for i in range(5)]
    assert g.count(_batch(3), ["only"]) == [(3, "only")]


def test_local_futures_are_resolved_and_chain(local_group):
    fut = local_group.double_async(_batch(4))
    assert isinstance(fut, LocalFuture) and fut.done()
    other = WorkerGroup(ResourcePool(1), EchoWorker, scale=10.0)
    assert other.total(fut) == [12.0]  # a future as the argument of another group's call
    other.shutdown()


def test_local_error_names_class_rank_method_and_keeps_cause(local_group):
    with pytest.raises(WorkerError, match=r"EchoWorker rank 0 failed in fail_on\(\)") as info:
        local_group.fail_on(0)
    assert "bad value on purpose" in str(info.value) and "Traceback" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)  # pdb can walk into the original frame
    assert local_group.fail_on(1) == [0]  # one rank, no stuck peers: the group stays usable


def test_local_init_error():
    pool = ResourcePool(1)
    with pytest.raises(WorkerError, match=r"EchoWorker rank 0 failed in __init__\(\)"):
        WorkerGroup(pool, EchoWorker, 1.0, "unexpected")
    assert pool.roles == []


def test_local_world_size_must_be_one():
    with pytest.raises(ValueError, match="use backend='ray'"):
        ResourcePool(2, backend="local")


def test_local_colocated_sibling_and_split():
    groups = colocated_groups(ResourcePool(1), {"actor": (Actor, (3,)), "ref": Ref})
    groups["actor"].bump()
    assert groups["ref"].read_actor() == [([1.0, 2.0, 3.0], True)]
    assert "not colocated" in groups["ref"].try_sibling("reward")[0]
    for g in groups.values():
        g.shutdown()


def test_local_build_role_groups_collapses_to_one_rank():
    with pytest.warns(UserWarning, match="runs as 1 rank"):
        groups = build_role_groups(pools={"main": 2, "aux": 1},
                                   roles={"actor": "main", "ref": "main", "reward": "aux"},
                                   classes={"actor": (Actor, (2,), {}), "ref": (Ref,), "reward": Reward})
    assert groups["actor"].pool is groups["ref"].pool and groups["reward"].pool is not groups["actor"].pool
    assert groups["reward"].sleep(0.0).get() == [0.0]
    for g in groups.values():
        g.shutdown()
    assert groups["actor"].pool.roles == []


def test_group_shutdown_then_call_raises():
    g = WorkerGroup(ResourcePool(1), Reward)
    g.shutdown()
    with pytest.raises(WorkerError, match="shut down"):
        g.pid()
    pool = ResourcePool(1)
    groups = colocated_groups(pool, {"actor": Actor, "ref": Ref})
    pool.shutdown()  # stops every role of the pool at once
    with pytest.raises(WorkerError, match="shut down"):
        groups["ref"].pid()
    groups["ref"].shutdown()  # harmless afterwards
    assert WorkerGroup(pool, Reward).pid() == [os.getpid()]  # a shut-down pool can host new groups


def test_worker_standalone():
    w = EchoWorker()
    assert (w.rank, w.world_size, w.dp_size) == (0, 1, 1)
    assert w.all_reduce_rank() == 1.0


def test_rank_zero_result_is_not_a_list_and_dp_rank_zero_is_refused():
    class R(Worker):
        @register(execute=Execute.RANK_ZERO)
        def head(self, b):
            return b

    g = WorkerGroup(ResourcePool(1), R)
    assert isinstance(g.head(_batch(2)), Batch)
    g.shutdown()
    with pytest.raises(ValueError, match="silently drop"):
        register(dispatch=Dispatch.DP_COMPUTE, execute=Execute.RANK_ZERO)


def test_a_run_stops_only_the_ray_that_its_own_pool_started(monkeypatch, tmp_path):
    """`shutdown_ray(only_ours=True)` (a trainer's teardown) stops a Ray that a pool started
    for want of one, never one that was up before the run: a caller's `ensure_ray()` (or a
    test session's). Checked on a stand-in for ray: no cluster starts here."""
    from types import SimpleNamespace

    from baton.controller import ray_backend as rb

    up = []
    fake = SimpleNamespace(is_initialized=lambda: bool(up), init=lambda **kw: up.append(kw),
                           shutdown=lambda: up.clear())
    monkeypatch.setattr(rb, "ray", fake)
    monkeypatch.setattr(rb, "_TEMP_DIRS", [])  # the session's real Ray keeps its own
    monkeypatch.setattr(rb, "_STARTED_BY_POOL", False)

    assert rb.ensure_ray(temp_dir=str(tmp_path)) is True and up  # a caller starts Ray ...
    rb.ensure_ray_for_pool()  # ... a pool finds it running ...
    rb.shutdown_ray(only_ours=True)  # ... and the run's teardown leaves it up
    assert up and rb.ensure_ray() is False
    rb.shutdown_ray()  # its owner stops it
    assert not up

    rb.ensure_ray_for_pool()  # nothing running: the pool starts Ray, for the run
    assert up and up[0]["include_dashboard"] is False
    rb.shutdown_ray(only_ours=True)
    assert not up and rb._TEMP_DIRS == []  # stopped, and its temp dir removed
