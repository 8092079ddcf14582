"""A real multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: one raylet per
node, each its own processes and object store): start and stop it (imported by name, as
`mn_cluster`: the suite runs with --import-mode=importlib and several conftest.py files).

The session's local Ray (tests/conftest.py) is shut down first; the next test that needs it
restarts it. Nodes: a head with no CPUs (only the driver connects there) and worker nodes
added per test module; each node offers a custom resource `node<i>` so a test can pin a pool.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def start_cluster(cpus_per_node: list[int], resources: list[dict] | None = None):
    """(cluster, [node handles]) with one worker node per entry (each with resource `node<i>`
    and resources[i]), connected as the driver."""
    import ray
    from ray.cluster_utils import Cluster

    from baton.controller import shutdown_ray

    shutdown_ray()
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_worker_niceness="0")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        # notice a dead node in ~3 s rather than Ray's default ~15-30 s
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
    nodes = [cluster.add_node(num_cpus=n, resources={f"node{i}": 100, **((resources or [])[i:i + 1] or [{}])[0]})
             for i, n in enumerate(cpus_per_node)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, runtime_env={"env_vars": {
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}})
    return cluster, nodes


def stop_cluster(cluster) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()
