"""How a driver-side call is split across ranks and how per-rank results are collected.

A worker method is marked with `@register(dispatch=..., execute=..., blocking=...)`. The
dispatch mode is a pair of functions, both per argument / per call and free of any backend:

    split(value, topo)    -> list with one value per rank (world_size long)
    collect(outputs, topo) -> the driver-side result, from the list of per-rank outputs

Keeping them pure functions of a small picklable `Topology` is what lets the Ray backend
run them on the cluster (re-splitting one group's output for another group) instead of
pulling the data through the driver.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

from baton.batch import Batch
from baton.registry import Registry

MESH_DIMS = ("dp", "fsdp", "tp")


class Dispatch(str, enum.Enum):
    ONE_TO_ALL = "one_to_all"  # every arg to every rank; list of per-rank results
    ALL_TO_ALL = "all_to_all"  # arg i-th element to rank i; list of per-rank results
    DP_COMPUTE = "dp_compute"  # Batch split by data-parallel rank; tp peers share a chunk
    # every arg to every rank, every rank runs, the driver gets rank 0's result: methods
    # whose ranks must all take part in a collective but that have one answer (e.g. a
    # sharded model's checkpoint, gathered to rank 0 and written there)
    ONE_TO_ALL_RANK0 = "one_to_all_rank0"


class Execute(str, enum.Enum):
    ALL = "all"
    RANK_ZERO = "rank_zero"  # only rank 0 runs (no collectives in such methods: peers are idle)


@dataclass(frozen=True)
class Topology:
    """Rank layout of a group: a row-major (dp, fsdp, tp) mesh over `world_size` ranks.

    The *data-parallel* index used to split data is the (dp, fsdp) coordinate flattened,
    because FSDP shards consume different data just like replicas do; tensor-parallel
    peers (same data index, different tp coordinate) consume the same data.
    """

    world_size: int
    mesh: tuple[int, int, int]

    def __post_init__(self) -> None:
        if len(self.mesh) != 3 or any(int(d) < 1 for d in self.mesh):
            raise ValueError(f"mesh must be 3 positive sizes {MESH_DIMS}, got {self.mesh}")
        if self.mesh[0] * self.mesh[1] * self.mesh[2] != self.world_size:
            raise ValueError(f"mesh {dict(zip(MESH_DIMS, self.mesh))} has "
                             f"{self.mesh[0] * self.mesh[1] * self.mesh[2]} slots, world size is {self.world_size}")

    @property
    def dp_size(self) -> int:
        return self.mesh[0] * self.mesh[1]

    @property
    def tp_size(self) -> int:
        return self.mesh[2]

    def dp_rank(self, rank: int) -> int:
        return rank // self.mesh[2]

    def tp_rank(self, rank: int) -> int:
        return rank % self.mesh[2]

    def collect_ranks(self) -> list[int]:
        """One rank per data-parallel index (tp_rank 0), ordered by dp_rank."""
        return [r for r in range(self.world_size) if self.tp_rank(r) == 0]


def normalize_mesh(mesh: Any, world_size: int) -> tuple[int, int, int]:
    """None -> (world_size, 1, 1); a dict may name any of dp/fsdp/tp (missing dims are 1,
    except dp, which takes what is left)."""
    if mesh is None:
        return (world_size, 1, 1)
    if isinstance(mesh, dict):
        unknown = set(mesh) - set(MESH_DIMS)
        if unknown:
            raise ValueError(f"unknown mesh dims {sorted(unknown)}; use {MESH_DIMS}")
        fsdp, tp = int(mesh.get("fsdp", 1)), int(mesh.get("tp", 1))
        dp = int(mesh["dp"]) if "dp" in mesh else world_size // max(1, fsdp * tp)
        mesh = (dp, fsdp, tp)
    out = tuple(int(d) for d in mesh)
    Topology(world_size, out)  # validates  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


# --- built-in modes ------------------------------------------------------------------
def _split_one_to_all(value: Any, topo: Topology) -> list[Any]:
    return [value] * topo.world_size


def _collect_list(outputs: list[Any], topo: Topology) -> list[Any]:
    return list(outputs)


def _collect_rank0(outputs: list[Any], topo: Topology) -> Any:
    return outputs[0]


def _split_all_to_all(value: Any, topo: Topology) -> list[Any]:
    if not isinstance(value, (list, tuple)) or len(value) != topo.world_size:
        got = f"{type(value).__name__} of length {len(value)}" if isinstance(value, (list, tuple)) \
            else type(value).__name__
        raise ValueError(f"ALL_TO_ALL arguments must be lists of length world_size={topo.world_size}, got {got}")
    return list(value)


def _split_dp(value: Any, topo: Topology) -> list[Any]:
    # Batches are chunked (padded so that every dp rank gets the same number of rows);
    # a list of exactly dp_size elements is taken as one element per dp rank (note: a
    # list that happens to have dp_size elements and was meant to be replicated is split -
    # wrap such a value in a tuple); anything else is replicated.
    if isinstance(value, Batch):
        parts: list[Any] = value.chunk(topo.dp_size)
    elif isinstance(value, list) and len(value) == topo.dp_size:
        parts = value
    else:
        return [value] * topo.world_size
    return [parts[topo.dp_rank(r)] for r in range(topo.world_size)]


def _collect_dp(outputs: list[Any], topo: Topology) -> Any:
    picked = [outputs[r] for r in topo.collect_ranks()]
    if picked and all(isinstance(o, Batch) for o in picked):
        return Batch.concat(picked)  # drops each chunk's trailing padding rows
    return picked


@dataclass(frozen=True)
class DispatchMode:
    name: str
    split: Callable[[Any, Topology], list[Any]]
    collect: Callable[[list[Any], Topology], Any]


_MODES = Registry("dispatch mode")


def register_dispatch_mode(name: str, split_fn: Callable[[Any, Topology], list[Any]],
                           collect_fn: Callable[[list[Any], Topology], Any]) -> str:
    """Add a mode usable as `@register(dispatch=name)`. `split_fn(value, topo)` is applied to
    every argument and returns one value per rank; `collect_fn(outputs, topo)` turns the
    per-rank outputs (all ranks, in rank order) into the driver-side result. Both must be
    picklable (module-level functions): the Ray backend may run them on the cluster."""
    _MODES.add(name, DispatchMode(name, split_fn, collect_fn))
    return name


def get_mode(name: str | Dispatch) -> DispatchMode:
    """The mode called `name` (UnknownName, a ValueError listing the known modes, if none)."""
    return _MODES[name.value if isinstance(name, Dispatch) else name]


register_dispatch_mode(Dispatch.ONE_TO_ALL.value, _split_one_to_all, _collect_list)
register_dispatch_mode(Dispatch.ALL_TO_ALL.value, _split_all_to_all, _collect_list)
register_dispatch_mode(Dispatch.DP_COMPUTE.value, _split_dp, _collect_dp)
register_dispatch_mode(Dispatch.ONE_TO_ALL_RANK0.value, _split_one_to_all, _collect_rank0)


# --- @register -----------------------------------------------------------------------
@dataclass(frozen=True)
class MethodSpec:
    dispatch: str
    execute: Execute
    blocking: bool

    @property
    def mode(self) -> DispatchMode:
        return get_mode(self.dispatch)


SPEC_ATTR = "__baton_method__"


def register(fn: Callable | None = None, *, dispatch: Dispatch | str = Dispatch.ONE_TO_ALL,
             execute: Execute = Execute.ALL, blocking: bool = True) -> Callable:
    """Mark a Worker method as callable from the driver through a WorkerGroup.
    Usable bare (`@register`) or with options."""
    name = dispatch.value if isinstance(dispatch, Dispatch) else str(dispatch)
    get_mode(name)  # fail at class definition on an unknown mode, not at the first call
    spec = MethodSpec(name, Execute(execute), bool(blocking))
    if spec.dispatch == Dispatch.DP_COMPUTE.value and spec.execute == Execute.RANK_ZERO:
        raise ValueError("DP_COMPUTE with Execute.RANK_ZERO would silently drop the chunks of the other "
                         "dp ranks; use Dispatch.ONE_TO_ALL with RANK_ZERO to give rank 0 the whole batch")

    def deco(f: Callable) -> Callable:
        setattr(f, SPEC_ATTR, spec)
        return f

    return deco(fn) if fn is not None else deco


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    out = {}
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            spec = getattr(fn, SPEC_ATTR, None)
            if isinstance(spec, MethodSpec):
                out[name] = spec
            elif name in out:  # an override without @register is no longer driver-callable
                del out[name]
    return out


__all__ = ["Dispatch", "Execute", "Topology", "DispatchMode", "MethodSpec", "register",
           "register_dispatch_mode", "get_mode", "registered_methods", "normalize_mesh"]
