"""`Worker`, the base class of everything that runs on a device slot, and the host that
builds workers inside a slot's process.

One *host* lives in each slot's process (a Ray actor, or the driver itself on the local
backend). It sets up torch.distributed and the device mesh once, then holds one instance
per role (several roles = colocation: same process, same memory, `sibling()` gives direct
access). The host fills in `rank`, `mesh`, ... *before* the subclass `__init__` runs, so
user code may use collectives in `__init__` without calling `super().__init__()` first.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from baton.batch import PAD_KEY, Batch
from baton.controller.devices import enable_tf32, to_driver, to_worker
from baton.controller.dispatch import MESH_DIMS, Dispatch, Topology


class WorkerError(RuntimeError):
    """A worker method failed (an exception, or the worker process died). The message
    names the worker class, rank and method and carries the remote traceback. `original`:
    the exception the worker's code raised, where it reached the driver (it pickled), so
    that the driver can treat e.g. a `DiskFullError` in a worker as it treats its own."""

    def __init__(self, worker_cls: str, rank: int | None, method: str, detail: str,
                 origin: str = "", original: BaseException | None = None) -> None:
        self.worker_cls, self.rank, self.method = worker_cls, rank, method
        self.detail, self.origin = detail, origin  # origin: uid of the pool that failed
        self.original = original
        where = f"{worker_cls} rank {rank}" if rank is not None else worker_cls
        super().__init__(f"{where} failed in {method}():\n{detail}".rstrip())

    @property
    def process_failed(self) -> bool:
        """The worker's process died, was stopped or never answered: there is no traceback of
        its code to show (`detail`'s first line says what happened)."""
        return self.original is None and "Traceback (most recent call last)" not in self.detail

    def __reduce__(self):  # keep the fields across pickling (Ray ships it to the driver)
        return (WorkerError, (self.worker_cls, self.rank, self.method, self.detail, self.origin, self.original))


@dataclass
class WorkerContext:
    role: str
    topo: Topology
    rank: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh
    roles: dict[str, "Worker"] = field(default_factory=dict)  # the host's roles (shared dict)


CALL_LOG_MAX = 100_000  # per process; older records are dropped first
_BUILDING: WorkerContext | None = None  # set by the host while a Worker is constructed


class Worker:
    """Subclass this and mark driver-callable methods with `@register(...)`.

    Available in `__init__` already: rank, world_size, local_rank, device, mesh (dims
    dp/fsdp/tp), dp_rank / dp_size (the data shard index: (dp, fsdp) flattened),
    tp_rank / tp_size, role. Instantiating a Worker directly (outside a group) gives a
    single-rank context, like the local backend.

    Devices: the host moves every `Batch` argument of a driver call to `self.device` once,
    and moves the results back to the CPU (`baton.controller.devices`); a role whose work
    is on the CPU whatever its slot (reward functions, the text in / text out rollout) sets
    `batch_on_device = False` and gets its arguments as they were sent.
    """

    batch_on_device: bool = True
    role: str
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh
    dp_rank: int
    dp_size: int
    tp_rank: int
    tp_size: int

    def __new__(cls, *args: Any, **kwargs: Any) -> "Worker":
        obj = super().__new__(cls)
        ctx = _BUILDING if _BUILDING is not None else _standalone_context(cls.__name__)
        obj._baton_ctx = ctx
        obj.role, obj.rank, obj.world_size = ctx.role, ctx.rank, ctx.topo.world_size
        obj.local_rank, obj.device, obj.mesh = ctx.local_rank, ctx.device, ctx.mesh
        obj.dp_rank, obj.dp_size = ctx.topo.dp_rank(ctx.rank), ctx.topo.dp_size
        obj.tp_rank, obj.tp_size = ctx.topo.tp_rank(ctx.rank), ctx.topo.tp_size
        return obj

    def sibling(self, role: str) -> "Worker":
        """The instance of `role` hosted in this same process (colocated roles only), e.g.
        the rollout engine reading the actor's parameters in place."""
        roles = self._baton_ctx.roles
        if role in roles:
            return roles[role]
        hosted = sorted(roles) or [self.role]
        raise LookupError(
            f"role {role!r} is not colocated with {self.role!r}: this process hosts {hosted}. "
            "Colocate roles by putting them on the same pool (colocated_groups / build_role_groups); "
            "roles are built in the order given, so a sibling is not visible in an earlier role's __init__.")


# --- process-level setup -----------------------------------------------------------
_MESH_CACHE: dict[tuple, DeviceMesh] = {}


def _device_for(use_cuda: bool, local_rank: int) -> torch.device:
    if not use_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("gpus_per_worker > 0 but CUDA is not available in this process")
    # Ray isolates GPUs per actor (CUDA_VISIBLE_DEVICES holds one id), so index 0 then.
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_distributed(topo: Topology, rank: int, local_rank: int, use_cuda: bool,
                     timeout_s: float, master: tuple[str, int] | None) -> tuple[torch.device, DeviceMesh]:
    """Create the default process group (gloo on CPU; gloo + nccl on GPU) and the device
    mesh. `master=None` means single-process: an in-memory store, no port needed."""
    device = _device_for(use_cuda, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        enable_tf32(device)  # fp32 matmuls as TF32 (CUDA only)
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if dist.is_initialized():
        if dist.get_world_size() != topo.world_size:
            raise RuntimeError(f"a process group of world size {dist.get_world_size()} already exists; "
                               f"this group needs {topo.world_size}")
    elif master is None:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]), RANK=str(rank),
                          WORLD_SIZE=str(topo.world_size), LOCAL_RANK=str(local_rank))
        dist.init_process_group(backend, rank=rank, world_size=topo.world_size, timeout=timeout)
    key = (device.type, topo.mesh)
    if key not in _MESH_CACHE:  # several local groups in one process share one mesh
        _MESH_CACHE[key] = init_device_mesh(device.type, topo.mesh, mesh_dim_names=MESH_DIMS)
    return device, _MESH_CACHE[key]


def _standalone_context(role: str) -> WorkerContext:
    topo = Topology(1, (1, 1, 1))
    device, mesh = init_distributed(topo, 0, 0, False, 60.0, None)
    return WorkerContext(role, topo, 0, 0, device, mesh)


def _propagate_pad(out: Any, args: tuple, kwargs: dict) -> Any:
    """DP_COMPUTE: a Batch result must say which of its rows are padding, so that the
    driver's concat (or the next group) drops them. Either it carries meta[PAD_KEY] itself
    (e.g. made with `Batch.repeat` / `.union` of the input), or it is row-aligned with its
    padded input chunk (one output row per input row) and inherits the input's count. A
    result of another length with no count is an error, never a guess."""
    if not isinstance(out, Batch) or PAD_KEY in out.meta:
        return out
    padded = [a for a in (*args, *kwargs.values()) if isinstance(a, Batch) and a.meta.get(PAD_KEY)]
    if not padded:
        return out
    src = padded[0]
    if len(src) != len(out):
        raise ValueError(f"DP_COMPUTE result has {len(out)} rows for an input chunk of {len(src)} rows "
                         f"whose last {src.meta[PAD_KEY]} are padding: return one row per input row, "
                         f"or derive the result with Batch.repeat/rows and set meta[{PAD_KEY!r}]")
    out.meta[PAD_KEY] = src.meta[PAD_KEY]
    return out


class HostCore:
    """What lives in one slot's process: the distributed setup and one instance per role."""

    def __init__(self, origin: str, topo: Topology, rank: int, chain_errors: bool) -> None:
        self.origin, self.topo, self.rank = origin, topo, rank
        self.chain_errors = chain_errors  # local: keep the original exception as __cause__
        self.roles: dict[str, Worker] = {}
        self.device: torch.device | None = None
        self.mesh: DeviceMesh | None = None
        self.local_rank = 0
        # Wall-clock start/end of every driver call, for a run's timeline (which role ran
        # when, on which rank); bounded, and emptied by `take_call_log`.
        self.call_log: deque[dict[str, Any]] = deque(maxlen=CALL_LOG_MAX)

    def setup(self, local_rank: int, use_cuda: bool, timeout_s: float,
              master: tuple[str, int] | None, threads: int = 0) -> int:
        """Process-wide set-up, once per slot: torch threads (0 = torch's default) for every
        role this process will host, then the process group and the device mesh."""
        self.local_rank = local_rank
        if threads:
            torch.set_num_threads(threads)
        try:
            self.device, self.mesh = init_distributed(self.topo, self.rank, local_rank, use_cuda,
                                                      timeout_s, master)
        except Exception as e:
            self._fail("Host", "init_process_group", e)
        return os.getpid()

    def create(self, role: str, cls: type, args: tuple, kwargs: dict) -> int:
        global _BUILDING
        if role in self.roles:
            raise ValueError(f"role {role!r} already exists in this process")
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"{cls!r} is not a subclass of baton.controller.Worker")
        _BUILDING = WorkerContext(role, self.topo, self.rank, self.local_rank, self.device,
                                  self.mesh, self.roles)
        try:
            self.roles[role] = cls(*args, **kwargs)
        except Exception as e:
            self._fail(cls.__name__, "__init__", e)
        finally:
            _BUILDING = None
        return os.getpid()

    def remove(self, role: str) -> None:
        self.roles.pop(role, None)

    def call(self, role: str, method: str, dispatch: str, args: tuple, kwargs: dict) -> Any:
        inst = self.roles[role]
        start = time.time()
        try:
            if type(inst).batch_on_device:  # the one place a call's data changes device
                args, kwargs = to_worker(args, kwargs, self.device)
            out = to_driver(getattr(inst, method)(*args, **kwargs), self.device)
        except Exception as e:
            self._fail(type(inst).__name__, method, e)
        finally:
            self.call_log.append({"role": role, "method": method, "rank": self.rank,
                                  "pid": os.getpid(), "start": start, "end": time.time()})
        if dispatch == Dispatch.DP_COMPUTE.value:
            out = _propagate_pad(out, args, kwargs)
        return out

    def take_call_log(self, role: str) -> list[dict[str, Any]]:
        """The recorded calls of `role` (oldest first), removed from the log."""
        mine = [c for c in self.call_log if c["role"] == role]
        rest = [c for c in self.call_log if c["role"] != role]
        self.call_log.clear()
        self.call_log.extend(rest)
        return mine

    def _fail(self, cls_name: str, method: str, e: BaseException) -> None:
        tb = e.__traceback__  # drop this host's own frame: the user's code is what matters
        tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb
        detail = "".join(traceback.format_exception(type(e), e, tb))
        err = WorkerError(cls_name, self.rank, method, detail, self.origin, e if self.chain_errors else _pickled(e))
        if self.chain_errors:
            raise err from e
        raise err from None  # the remote cause may not pickle; its traceback is in the text


def _pickled(e: BaseException) -> BaseException | None:
    """`e` as it will reach the driver (a copy with no traceback), or None: a class the driver
    might not import (only Python's and baton's travel), or one that does not pickle."""
    if type(e).__module__ != "builtins" and not type(e).__module__.startswith("baton."):
        return None
    try:
        return pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001 - any user exception type may refuse
        return None
