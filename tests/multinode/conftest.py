"""A real multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: one raylet per
node, each its own processes and object store), for the tests in this directory.

The session's local Ray (tests/conftest.py) is shut down first; the next test that needs it
restarts it. Nodes: a head with no CPUs (only the driver connects there) and worker nodes
added per test module; each node offers a custom resource `node<i>` so a test can pin a pool.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `mn_workers` by name (the suite runs with --import-mode=importlib)
    sys.path.insert(0, str(HERE))


from mn_cluster import start_cluster, stop_cluster  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    cluster, nodes = start_cluster([2, 2])
    yield cluster, nodes
    stop_cluster(cluster)
