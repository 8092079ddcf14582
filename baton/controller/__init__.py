"""Single controller: one driver process steers groups of workers (verl-style, smaller).

    pool = ResourcePool(2, backend="ray")                      # 2 slots, one process each
    actor = WorkerGroup(pool, ActorWorker, model_cfg)          # one instance per slot
    out = actor.compute_logprobs(batch)                        # split, run on all ranks, collect

Workers subclass `Worker` and mark driver-callable methods with `@register(dispatch=...,
execute=..., blocking=...)`. Roles on one pool share processes (colocated, `sibling()`);
roles on different pools run concurrently. Backends: "local" (one rank in the driver,
debuggable) and "ray". A failure in any rank is a `WorkerError` naming class, rank and
method, and a group whose process died is marked broken instead of hanging.
"""

from baton.controller.dispatch import (Dispatch, DispatchMode, Execute, Topology, register,
                                       register_dispatch_mode)
from baton.controller.future import Future, LocalFuture
from baton.controller.group import WorkerGroup, build_role_groups, colocated_groups
from baton.controller.pool import ResourcePool
from baton.controller.worker import Worker, WorkerError


def ensure_ray(num_cpus: int = 8, **kwargs) -> bool:
    """Start a local Ray instance with baton's settings unless one is running; True if it
    started one, which the caller then owns (see ray_backend.ensure_ray)."""
    from baton.controller.ray_backend import ensure_ray as _ensure
    return _ensure(num_cpus=num_cpus, **kwargs)


def shutdown_ray(only_ours: bool = False) -> None:
    """Shut Ray down and remove the temp dir `ensure_ray` made (with only_ours: only if a
    pool started this Ray instance for want of one; see ray_backend.shutdown_ray)."""
    from baton.controller.ray_backend import shutdown_ray as _shutdown
    _shutdown(only_ours)


__all__ = ["Worker", "WorkerGroup", "ResourcePool", "register", "Dispatch", "Execute", "WorkerError",
           "Future", "LocalFuture", "Topology", "DispatchMode", "register_dispatch_mode",
           "colocated_groups", "build_role_groups", "ensure_ray", "shutdown_ray"]
