"""Pools on a real 2-node Ray cluster: placement-group strategy by config, per-node local
ranks, a rendezvous address every node can reach, a collective across nodes, and a pool
pinned to a node by a custom resource. The spread test runs by default; the rest are slow."""

from __future__ import annotations

import pytest

from baton.controller import ResourcePool, WorkerGroup
from baton.controller.placement import PlacementConfig
from mn_workers import NodeWorker



def _group(**kw) -> WorkerGroup:
    return WorkerGroup(ResourcePool(backend="ray", threads_per_worker=1, **kw), NodeWorker)


def test_strict_spread_one_rank_per_node(two_nodes):
    """The default run's multi-node test (~15-20 s on a busy 2-core machine, cluster start included)."""
    import ray

    spread = _group(world_size=2, strategy="STRICT_SPREAD")
    try:
        where = spread.where()
        assert len({w["node"] for w in where}) == 2  # one rank per node
        assert [w["local_rank"] for w in where] == [0, 0]  # first (only) rank on its node
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        assert {w["master"] for w in where} == {ips[where[0]["node"]]}  # rank 0's node, not loopback
        assert spread.all_reduce_rank() == [3.0, 3.0]  # gloo across the two nodes: 1 + 2
    finally:
        spread.shutdown()


@pytest.mark.slow
def test_strict_pack_one_node_local_ranks(two_nodes):
    packed = _group(world_size=2, strategy="STRICT_PACK")
    try:
        where = packed.where()
        assert len({w["node"] for w in where}) == 1
        assert [w["local_rank"] for w in where] == [0, 1]
        assert {w["master"] for w in where} == {"127.0.0.1"}
    finally:
        packed.shutdown()


@pytest.mark.slow
def test_pool_pinned_to_a_node_by_resource(two_nodes):
    import ray

    node1 = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node1" in n["Resources"])
    g = _group(world_size=2, resources={"node1": 1})
    try:
        assert {w["node"] for w in g.where()} == {node1}
    finally:
        g.shutdown()


def test_placement_config_carries_strategies_to_the_pools():
    p = PlacementConfig(backend="ray", world_size=2, pools={"gen": 1}, strategy="SPREAD",
                        strategies={"gen": "PACK"}, resources={"gen": {"node1": 1}})
    p.check(["actor", "rollout"])
    assert p.pool_specs() == {"main": {"world_size": 2, "strategy": "SPREAD"},
                              "gen": {"world_size": 1, "resources": {"node1": 1}}}
    assert PlacementConfig().pool_specs() == {"main": 1}
    with pytest.raises(ValueError, match="undefined pool"):
        PlacementConfig(backend="ray", strategies={"nope": "PACK"}).check([])
    with pytest.raises(ValueError, match="one of"):
        PlacementConfig(backend="ray", strategies={"main": "SIDEWAYS"}).check([])
    with pytest.raises(ValueError, match="need placement.backend=ray"):
        PlacementConfig(strategy="SPREAD").check([])
