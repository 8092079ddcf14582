"""A node dies mid-call: the driver gets a WorkerError naming the worker, rank and method
within 30 s (Ray notices the dead raylet by its health checks, set to ~3 s in conftest)."""

from __future__ import annotations

import threading
import time

import pytest

from baton.controller import ResourcePool, WorkerGroup
from baton.controller.worker import WorkerError
from mn_cluster import start_cluster, stop_cluster
from mn_workers import NodeWorker

pytestmark = pytest.mark.slow  # its own cluster (one node is lost): ~30-60 s on a busy 2-core machine


def test_node_killed_mid_call_is_a_named_error_within_30s():
    cluster, nodes = start_cluster([1, 1])
    try:
        g = WorkerGroup(ResourcePool(2, backend="ray", strategy="STRICT_SPREAD", threads_per_worker=1), NodeWorker)
        where = g.where()
        lost_rank = next(w["rank"] for w in where if w["node"] == nodes[1].node_id)
        out: dict = {}

        def call() -> None:
            try:
                g.sleep(120)
            except BaseException as e:  # noqa: BLE001 - handed to the test thread
                out["error"], out["t"] = e, time.monotonic()

        t = threading.Thread(target=call, daemon=True)
        t.start()
        time.sleep(1.0)
        killed = time.monotonic()
        cluster.remove_node(nodes[1], allow_graceful=False)
        t.join(timeout=30)
        assert "error" in out, "no error within 30 s of the node's death"
        err = out["error"]
        assert isinstance(err, WorkerError), repr(err)
        assert out["t"] - killed < 30
        assert (err.worker_cls, err.rank, err.method) == ("NodeWorker", lost_rank, "sleep")
        assert "died" in str(err)
        g.shutdown()
    finally:
        stop_cluster(cluster)
