"""baton: reinforcement-learning post-training of language models, driven by one controller.

The public names of the single controller and the data container import from here:

    from baton import Batch, Worker, WorkerGroup, ResourcePool, register, Dispatch

They are resolved on first use (PEP 562), so `import baton.algos` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Batch": "baton.batch", "collate": "baton.batch",
    **{name: "baton.controller" for name in (
        "Worker", "WorkerGroup", "ResourcePool", "register", "Dispatch", "Execute", "WorkerError",
        "Future", "Topology", "DispatchMode", "register_dispatch_mode", "colocated_groups",
        "build_role_groups", "ensure_ray", "shutdown_ray")},
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'baton' has no attribute {name!r}")
