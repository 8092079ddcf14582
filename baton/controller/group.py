"""`WorkerGroup`: the driver-side handle of one role running on every slot of a pool.

Every `@register`-ed method of the worker class becomes a method of the group with the
same name: split the arguments (dispatch mode), run on the ranks (execute mode), collect.
`blocking=False` methods return a `Future` instead of the value.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from baton.controller.dispatch import MethodSpec, registered_methods
from baton.controller.future import Future
from baton.controller.pool import ResourcePool
from baton.controller.worker import Worker, WorkerError


class WorkerGroup:
    """`WorkerGroup(pool, worker_cls, *init_args, **init_kwargs)`.

    Groups on the same pool share its processes (colocated; `Worker.sibling` works between
    them); groups on different pools run concurrently. The role name defaults to the class
    name; `colocated_groups` / `build_role_groups` name roles explicitly.
    """

    def __init__(self, pool: ResourcePool, worker_cls: type, *init_args: Any, **init_kwargs: Any) -> None:
        role, i = worker_cls.__name__, 1
        while role in pool.roles:
            i += 1
            role = f"{worker_cls.__name__}#{i}"
        self._setup(pool, role, worker_cls, init_args, init_kwargs)

    @classmethod
    def _create(cls, pool: ResourcePool, role: str, worker_cls: type, args: tuple, kwargs: dict) -> "WorkerGroup":
        if role in pool.roles:
            raise ValueError(f"pool {pool.name!r} already hosts a role named {role!r}")
        self = cls.__new__(cls)
        self._setup(pool, role, worker_cls, args, kwargs)
        return self

    def _setup(self, pool: ResourcePool, role: str, worker_cls: type, args: tuple, kwargs: dict) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(f"{worker_cls!r} is not a subclass of baton.controller.Worker")
        self.pool, self.role, self.worker_cls = pool, role, worker_cls
        self._closed = False
        self._methods = registered_methods(worker_cls)
        clash = sorted(set(self._methods) & set(dir(WorkerGroup)))
        if clash:
            raise ValueError(f"{worker_cls.__name__} registers methods that clash with WorkerGroup "
                             f"attributes: {clash}; rename them")
        for name, spec in self._methods.items():
            setattr(self, name, self._bind(name, spec))
        self._generation = pool.generation
        self._check_usable("__init__")
        backend = pool.backend  # starts the pool's processes on first use
        pool.roles.append(role)
        try:
            self.pids: list[int] = backend.create_role(role, worker_cls, args, kwargs)
        except BaseException:
            pool.roles.remove(role)
            raise

    def _bind(self, name: str, spec: MethodSpec) -> Any:
        fn = getattr(self.worker_cls, name)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            fut = self._call(name, spec, args, kwargs)
            return fut.get() if spec.blocking else fut

        return call

    def _check_usable(self, method: str) -> None:
        if self._closed or self._generation != self.pool.generation:
            raise WorkerError(self.worker_cls.__name__, None, method, "the group (or its pool) was shut down",
                              self.pool.uid)
        if self.pool.broken:
            raise WorkerError(self.worker_cls.__name__, None, method,
                              "the group is broken by an earlier failure; shut it down and build a new one. "
                              f"Earlier failure:\n{self.pool.broken}", self.pool.uid)

    def _call(self, name: str, spec: MethodSpec, args: tuple, kwargs: dict) -> Future:
        self._check_usable(name)
        return self.pool.backend.call(self.role, self.worker_cls.__name__, name, spec, args, kwargs)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Future:
        """Call a registered method without waiting, whatever its `blocking` flag: returns a
        Future. E.g. `a = actor.submit("update", batch); c = critic.update_critic(batch)`,
        then `a.get(), c.get()`: groups on different pools run the two at the same time."""
        if method not in self._methods:
            raise AttributeError(f"{self.worker_cls.__name__} has no registered method {method!r}; "
                                 f"it has {sorted(self._methods)}")
        return self._call(method, self._methods[method], args, kwargs)

    def call_log(self) -> list[dict[str, Any]]:
        """This role's calls on every rank since the last call_log (role, method, rank, pid,
        start, end: wall-clock seconds), recorded by the host around each call; a driver
        writes them out as a timeline of which role ran when."""
        self._check_usable("call_log")
        return self.pool.backend.call_log(self.role)

    # --- introspection and lifetime --------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.pool.world_size

    @property
    def dp_size(self) -> int:
        return self.pool.topology.dp_size

    @property
    def topology(self):
        return self.pool.topology

    @property
    def broken(self) -> bool:
        return self.pool.broken is not None

    def shutdown(self) -> None:
        """Remove this role; the pool's processes stop with the last role, or at once if
        the pool is broken (its processes may be stuck in a collective)."""
        if self._closed:
            return
        self._closed = True
        pool = self.pool
        if self._generation != pool.generation:
            return  # the pool was shut down already
        if self.role in pool.roles:
            pool.roles.remove(self.role)
        if pool.broken or not pool.roles:
            pool.shutdown()
        else:
            pool.backend.remove_role(self.role)

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (f"WorkerGroup({self.role!r}, {self.worker_cls.__name__}, pool={self.pool.name!r}, "
                f"world_size={self.world_size}, methods={sorted(self._methods)})")


def _normalize_entry(role: str, entry: Any) -> tuple[type, tuple, dict]:
    if isinstance(entry, type):
        return entry, (), {}
    entry = tuple(entry)
    if not 1 <= len(entry) <= 3:
        raise ValueError(f"role {role!r}: expected cls or (cls, args[, kwargs]), got {entry!r}")
    args = entry[1] if len(entry) > 1 else ()
    kwargs = entry[2] if len(entry) > 2 else {}
    return entry[0], tuple(args), dict(kwargs)


def colocated_groups(pool: ResourcePool, roles: dict[str, Any]) -> dict[str, WorkerGroup]:
    """Host several roles in ONE process per slot: `{"actor": (ActorCls, args, kwargs), ...}`
    -> {role: WorkerGroup}. Roles are built in the given order (all ranks of one role, then
    the next), so a role's `__init__` may use `self.sibling(earlier_role)`."""
    groups: dict[str, WorkerGroup] = {}
    try:
        for role, entry in roles.items():
            cls, args, kwargs = _normalize_entry(role, entry)
            groups[role] = WorkerGroup._create(pool, role, cls, args, kwargs)
    except BaseException:
        for g in groups.values():
            g.shutdown()
        raise
    return groups


def build_role_groups(pools: dict[str, Any], roles: dict[str, str], classes: dict[str, Any],
                      backend: str = "local", **pool_kwargs: Any) -> dict[str, WorkerGroup]:
    """Build groups from a role -> pool mapping; roles that share a pool are colocated.

    pools: name -> world size, or dict of ResourcePool arguments, or a ResourcePool.
    roles: role -> pool name. classes: role -> cls | (cls, args[, kwargs]).
    With backend="local" every pool collapses to one rank in the driver (a debugging run
    of the same config; a warning says so).
    """
    unknown = sorted({p for p in roles.values() if p not in pools})
    if unknown:
        raise ValueError(f"roles refer to unknown pools {unknown}; pools are {sorted(pools)}")
    missing = sorted(set(roles) - set(classes))
    if missing:
        raise ValueError(f"no class given for roles {missing}")
    built: dict[str, ResourcePool] = {}
    for pname in dict.fromkeys(roles.values()):  # pools in order of first use; unused ones are not started
        spec = pools[pname]
        if isinstance(spec, ResourcePool):
            built[pname] = spec
            continue
        kw = {**pool_kwargs, **({"world_size": spec} if isinstance(spec, int) else dict(spec))}
        kw.setdefault("backend", backend)
        if kw["backend"] == "local" and (kw["world_size"] != 1 or kw.get("mesh")):
            warnings.warn(f"backend='local': pool {pname!r} runs as 1 rank instead of {kw['world_size']}",
                          stacklevel=2)
            kw.update(world_size=1, mesh=None)
        built[pname] = ResourcePool(name=pname, **kw)
    groups: dict[str, WorkerGroup] = {}
    try:
        for pname, pool in built.items():
            groups.update(colocated_groups(pool, {r: classes[r] for r, p in roles.items() if p == pname}))
    except BaseException:
        for g in groups.values():
            g.shutdown()
        raise
    return {r: groups[r] for r in roles}
