"""The local backend: a pool of world size 1 that runs in the driver's own process.

Every role's methods run in the caller's thread, so `breakpoint()` in a worker method
stops there. No peer can be left stuck in a collective, so a failed call does not break
the pool.
"""

from __future__ import annotations

from typing import Any

from baton.controller.dispatch import Execute, MethodSpec
from baton.controller.future import Future, LocalFuture, split_call
from baton.controller.worker import HostCore, WorkerError


class LocalBackend:
    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.host = HostCore(pool.uid, pool.topology, rank=0, chain_errors=True)
        self.pids: list[int] = []

    def start(self) -> None:
        if self.pool.gpus_per_worker:
            import torch
            use_cuda = torch.cuda.is_available()
        else:
            use_cuda = False
        self.pids = [self.host.setup(0, use_cuda, self.pool.dist_timeout_s, None,
                                    self.pool.threads_per_worker)]

    def create_role(self, role: str, cls: type, args: tuple, kwargs: dict) -> list[int]:
        return [self.host.create(role, cls, args, kwargs)]

    def remove_role(self, role: str) -> None:
        self.host.remove(role)

    def call(self, role: str, cls_name: str, method: str, spec: MethodSpec, args: tuple,
             kwargs: dict) -> Future:
        topo, mode = self.pool.topology, spec.mode
        try:
            (r_args, r_kwargs), = split_call(mode, topo, args, kwargs,
                                             lambda f: mode.split(f.get(), topo))
            out = self.host.call(role, method, spec.dispatch, r_args, r_kwargs)
            value = out if spec.execute == Execute.RANK_ZERO else mode.collect([out], topo)
        except WorkerError as e:
            return LocalFuture(error=e)
        return LocalFuture(value)

    def call_log(self, role: str) -> list[dict[str, Any]]:
        return self.host.take_call_log(role)

    def shutdown(self) -> None:
        # The driver's process group stays: other local pools in this process share it.
        self.host.roles.clear()
