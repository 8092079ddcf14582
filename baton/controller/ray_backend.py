"""The Ray backend: one host actor per slot, pinned to a placement-group bundle.

The only module of baton that imports ray. Failures: results are awaited with `ray.wait`
one at a time, so the driver raises as soon as any rank fails (an exception, or a dead
process) even while its peers sit blocked in a collective; the pool is then marked broken.
Futures passed between groups move as object refs: the same dp layout passes each rank's
ref straight on; otherwise a small task on the cluster collects and re-splits the data.

Stuck is as loud as dead: while the driver waits it looks at the ranks it waits for (on its
own node, from /proc): a process that is stopped (SIGSTOP, a debugger) for STOPPED_GRACE_S
is a WorkerError naming class, rank, pid and method. Every wait has a deadline: the
caller's `timeout`, else the pool's `call_timeout_s` (config), else one derived from the
method's history (HISTORY_FACTOR x its longest call once it has run HISTORY_MIN_CALLS
times, at least HISTORY_MIN_S). When a rank fails, the driver gives the others
CAUSE_GRACE_S to fail too and names a rank that *died* as the cause (a survivor's
"Connection closed by peer" from gloo is listed as a consequence).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from baton.controller.dispatch import Dispatch, Execute, MethodSpec, Topology
from baton.controller.future import Future, split_call
from baton.controller.worker import HostCore, WorkerError
from baton.runs.ray_temp import RAY_TEMP_PREFIX, record_temp_dir_owner, remove_stale_ray_temp_dirs

log = logging.getLogger(__name__)

_TEMP_DIRS: list[str] = []
_STARTED_BY_POOL = False  # the running Ray was started by a pool for want of one (RayBackend.start)


def ensure_ray(num_cpus: int = 8, num_gpus: int | None = None, temp_dir: str | None = None,
               **init_kwargs: Any) -> bool:
    """Start a local Ray instance unless one is running: auth off, no usage stats, no
    dashboard, and a temp dir of its own (removed by `shutdown_ray`). Returns whether it
    started one. Whoever calls it owns that instance: a trainer's `shutdown_ray(only_ours=True)`
    leaves it up, `shutdown_ray()` stops it."""
    global _STARTED_BY_POOL
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):  # an existing cluster (`ray job submit`, a KubeRay RayJob): join it,
        # sized as it is; not ours to stop (docs/MULTINODE.md)
        with _apart_from_the_run_s_signals():
            ray.init(address=os.environ["RAY_ADDRESS"], **{k: v for k, v in init_kwargs.items() if k == "runtime_env"})
        return False
    _STARTED_BY_POOL = False
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray starts worker processes at nice 15 (below its driver). Here the workers do the
    # training and the driver mostly waits; at nice 15 a worker gets 1/28 of the CPU share of
    # a nice-0 process on a busy machine (CFS weights 36 vs 1024), e.g. a generator running
    # beside a trainer in the driver (trainer.mode=one_step_off, local backend).
    os.environ.setdefault("RAY_worker_niceness", "0")
    if temp_dir is None:
        # Temp dirs of earlier runs whose driver died (e.g. SIGKILL) would stay forever.
        for stale in remove_stale_ray_temp_dirs():
            log.info("removed the Ray temp dir of a dead baton run: %s", stale)
        temp_dir = tempfile.mkdtemp(prefix=RAY_TEMP_PREFIX)  # short: Ray's socket paths are length-limited
        record_temp_dir_owner(temp_dir)  # so a later start can tell that this run is gone
        _TEMP_DIRS.append(temp_dir)
    init_kwargs.setdefault("include_dashboard", False)
    with _apart_from_the_run_s_signals():
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, _temp_dir=temp_dir, **init_kwargs)
    return True


@contextlib.contextmanager
def _apart_from_the_run_s_signals():
    """Start Ray so that a run's signal handling holds (docs/RELIABILITY.md, signals):

    - ray.init replaces the driver's SIGTERM handler with `sys.exit(15)`, and its core
      worker's C++ handler prints a stack trace on SIGTERM before passing it on: a run that had
      its own handler (finish the step, save it, exit 143: `baton.trainers.session.run.RunSession`)
      died with a trace, exit 15, no checkpoint. A Python handler set before ray.init is set
      again after it (which also takes the C++ handler off); default ones are left to Ray.
    - Ray's own processes (GCS, raylet and the agents it starts; its workers already have a
      group each) would be in the driver's process group: a SIGTERM to the group (SLURM, a
      supervisor, `kill -TERM -PGID`) stopped the raylet at once, and the driver's core
      worker exited 1 without a word while its run was saving. They get a process group of
      their own where they still die with the driver (Ray's fate sharing: PR_SET_PDEATHSIG).
    """
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    services = getattr(getattr(ray, "_private", None), "services", None)
    popen = getattr(services, "ConsolePopen", None)
    if popen is not None and ray._private.utils.detect_fate_sharing_support():
        class _OwnGroupPopen(popen):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("process_group", 0)
                super().__init__(*args, **kwargs)

        services.ConsolePopen = _OwnGroupPopen
    try:
        yield
    finally:
        if popen is not None:
            services.ConsolePopen = popen
        for s, handler in saved.items():
            if callable(handler):
                signal.signal(s, handler)


def check_serializable(obj: Any) -> str | None:
    """Why Ray could not send `obj` to a worker process (its cloudpickle's error, in one
    line), or None when it can: a Python reward function bound for a Ray actor
    (`baton.python_api`) is checked before the run starts."""
    try:
        ray.cloudpickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - whatever cloudpickle raises is the reason
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    return None


def ensure_ray_for_pool() -> None:
    """What a pool does on start: `ensure_ray()`; an instance started here belongs to the run
    (nobody else asked for it), so the run's teardown (`shutdown_ray(only_ours=True)`) stops it."""
    global _STARTED_BY_POOL
    if ensure_ray():
        _STARTED_BY_POOL = True


def shutdown_ray(only_ours: bool = False) -> None:
    """Shut Ray down and remove the temp dir `ensure_ray` made. With only_ours (what a trainer
    calls when its run ends): only if a pool of baton's started this instance because none
    was running; one that was up before (`ensure_ray`, `ray.init`, a test session's) stays up
    for its owner."""
    global _STARTED_BY_POOL
    if only_ours and not _STARTED_BY_POOL:
        return
    _STARTED_BY_POOL = False
    ray.shutdown()
    while _TEMP_DIRS:
        shutil.rmtree(_TEMP_DIRS.pop(), ignore_errors=True)


@ray.remote
class _Host:
    """The per-slot process: a HostCore plus what only Ray needs (node info, a port)."""

    def __init__(self, origin: str, topo: Topology, rank: int) -> None:
        self.core = HostCore(origin, topo, rank, chain_errors=False)

    def node_info(self) -> tuple[str, str]:
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def setup(self, *args: Any) -> int:
        return self.core.setup(*args)

    def create(self, role: str, cls: type, args: tuple, kwargs: dict) -> int:
        return self.core.create(role, cls, args, kwargs)

    def remove(self, role: str) -> None:
        self.core.remove(role)

    def take_call_log(self, role: str) -> list[dict[str, Any]]:
        return self.core.take_call_log(role)

    def call(self, _baton_spec: tuple[str, str, str], *args: Any, **kwargs: Any) -> Any:
        role, method, dispatch = _baton_spec
        return self.core.call(role, method, dispatch, args, kwargs)


def _finish(outputs: tuple, collect: Any, topo: Topology, rank_zero: bool) -> Any:
    return outputs[0] if rank_zero else collect(list(outputs), topo)


@ray.remote(num_cpus=0)
def _collect_task(collect: Any, topo: Topology, rank_zero: bool, *outputs: Any) -> Any:
    return _finish(outputs, collect, topo, rank_zero)


@ray.remote(num_cpus=0)
def _collect_split_task(collect: Any, topo: Topology, rank_zero: bool, split: Any,
                        target: Topology, *outputs: Any) -> Any:
    parts = split(_finish(outputs, collect, topo, rank_zero), target)
    return tuple(parts) if target.world_size > 1 else parts[0]


_SMALL = (int, float, bool, str, bytes, type(None))
STOPPED_GRACE_S = 2.0  # a rank stopped this long is an error (a debugger's brief stop is not)
POLL_S = 0.5  # how often a waiting driver looks at the ranks it waits for
CAUSE_GRACE_S = 5.0  # after a failure, how long the other ranks get to show whether one died
HISTORY_MIN_CALLS, HISTORY_FACTOR, HISTORY_MIN_S = 3, 20.0, 600.0


def pick_cause(failures: list[tuple[str, int, str]]) -> tuple[tuple[str, int, str], list[tuple[str, int, str]]]:
    """(cause, consequences) of a call's failures, each (kind, rank, text) with kind "died"
    (the rank's process is gone), "stopped" or "raised": a dead or stopped rank is the cause,
    in preference to the first that merely raised (its peers see the connection close)."""
    order = {"died": 0, "stopped": 1}
    cause = min(failures, key=lambda f: order.get(f[0], 2))
    return cause, [f for f in failures if f is not cause]


def _proc_state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, T, Z, ...), or None (gone / not Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class RayBackend:
    def __init__(self, pool: Any) -> None:
        self.pool, self.topo = pool, pool.topology
        self.hosts: list[Any] = []
        self.pg: Any = None
        self.pids: list[int] = []
        self.actor_ranks: dict[str, int] = {}
        self.local: list[bool] = []  # per rank: on the driver's node (its /proc can be read)
        self.history: dict[tuple[str, str], tuple[int, float]] = {}  # (cls, method) -> (calls, longest s)
        self.classes: dict[str, str] = {}  # role -> its worker class's name (what a failure names)

    # --- life cycle ------------------------------------------------------------------
    def start(self) -> None:
        ensure_ray_for_pool()
        p = self.pool
        bundle = {"CPU": float(p.cpus_per_worker), **{k: float(v) for k, v in p.resources.items()}}
        if p.gpus_per_worker:
            bundle["GPU"] = float(p.gpus_per_worker)
        self.pg = placement_group([dict(bundle) for _ in range(p.world_size)], strategy=p.strategy)
        try:
            ray.get(self.pg.ready(), timeout=p.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise RuntimeError(f"pool {p.name!r}: {p.world_size} bundles of {bundle} not placed within "
                               f"{p.ready_timeout_s} s; free resources: {ray.available_resources()}") from None
        self.hosts = [_Host.options(
            num_cpus=p.cpus_per_worker, num_gpus=p.gpus_per_worker or None, resources=p.resources or None,
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
        ).remote(p.uid, self.topo, i) for i in range(p.world_size)]
        self.actor_ranks = {h._actor_id.hex(): i for i, h in enumerate(self.hosts)}
        try:
            nodes = self.wait([h.node_info.remote() for h in self.hosts], "Host", "node_info")
            port = self.wait([self.hosts[0].free_port.remote()], "Host", "free_port")[0]
            # Single node: loopback, which always works for gloo/nccl rendezvous.
            addr = "127.0.0.1" if len({n for n, _ in nodes}) == 1 else nodes[0][1]
            local = [sum(1 for n, _ in nodes[:i] if n == nodes[i][0]) for i in range(len(nodes))]
            use_cuda = bool(p.gpus_per_worker)
            self.pids = self.wait([h.setup.remote(local[i], use_cuda, p.dist_timeout_s, (addr, port),
                                                  p.threads_per_worker)
                                   for i, h in enumerate(self.hosts)], "Host", "setup")
            here = ray.get_runtime_context().get_node_id()
            self.local = [n == here for n, _ in nodes]
        except BaseException:
            self.shutdown()
            raise

    def create_role(self, role: str, cls: type, args: tuple, kwargs: dict) -> list[int]:
        args_ref, kwargs_ref = ray.put(args), ray.put(kwargs)  # one copy, not one per rank
        self.classes[role] = cls.__name__
        return self.wait([h.create.remote(role, cls, args_ref, kwargs_ref) for h in self.hosts],
                         cls.__name__, "__init__")

    def remove_role(self, role: str) -> None:
        self.wait([h.remove.remote(role) for h in self.hosts], "Host", "remove")

    def call_log(self, role: str) -> list[dict[str, Any]]:
        # Queued behind the calls in flight on each host: returns once they have finished.
        # a failure here (a worker process that died) names the role's class, not the host
        logs = self.wait([h.take_call_log.remote(role) for h in self.hosts], self.classes.get(role, "Host"),
                         "call_log")
        return [c for part in logs for c in part]

    def shutdown(self) -> None:
        for h in self.hosts:
            ray.kill(h, no_restart=True)
        self.hosts = []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None

    # --- calls -----------------------------------------------------------------------
    def call(self, role: str, cls_name: str, method: str, spec: MethodSpec, args: tuple,
             kwargs: dict) -> "RayFuture":
        mode = spec.mode
        # Pools whose futures feed this call (transitively): a failure that originates in
        # one of them marks that pool broken too, since its ranks may be stuck.
        sources: dict[str, Any] = {}

        def resolve(f: Future) -> list[Any]:
            if isinstance(f, RayFuture):
                sources.update(f.sources)
                sources[f.backend.pool.uid] = f.backend.pool
            return self._resolve(f, spec)

        per_rank = split_call(mode, self.topo, args, kwargs, resolve)
        ranks = [0] if spec.execute == Execute.RANK_ZERO else list(range(self.topo.world_size))
        # A value that several ranks receive (replicated args; a chunk shared by tp peers)
        # goes to the object store once instead of once per rank.
        seen: dict[int, int] = {}
        for r in ranks:
            for v in (*per_rank[r][0], *per_rank[r][1].values()):
                seen[id(v)] = seen.get(id(v), 0) + 1
        puts: dict[int, Any] = {}

        def ship(v: Any) -> Any:
            if seen.get(id(v), 0) < 2 or isinstance(v, (*_SMALL, ray.ObjectRef)):
                return v
            if id(v) not in puts:
                puts[id(v)] = ray.put(v)
            return puts[id(v)]

        refs = []
        for r in ranks:
            a, k = per_rank[r]
            refs.append(self.hosts[r].call.remote((role, method, spec.dispatch),
                                                  *map(ship, a), **{n: ship(v) for n, v in k.items()}))
        return RayFuture(self, cls_name, method, spec, refs, ranks, sources)

    def _resolve(self, fut: Future, spec: MethodSpec) -> list[Any]:
        if not isinstance(fut, RayFuture):
            return spec.mode.split(fut.get(), self.topo)
        p, target = fut.backend.topo, self.topo
        rank_zero = fut.spec.execute == Execute.RANK_ZERO
        dp = Dispatch.DP_COMPUTE.value
        if (spec.dispatch == dp and fut.spec.dispatch == dp and not rank_zero
                and p.dp_size == target.dp_size):
            by_dp = {p.dp_rank(r): fut.refs[r] for r in p.collect_ranks()}  # same layout: hand refs on
            return [by_dp[target.dp_rank(r)] for r in range(target.world_size)]
        collect = fut.spec.mode.collect
        if spec.dispatch == Dispatch.ONE_TO_ALL.value:
            return [_collect_task.remote(collect, p, rank_zero, *fut.refs)] * target.world_size
        out = _collect_split_task.options(num_returns=target.world_size).remote(
            collect, p, rank_zero, spec.mode.split, target, *fut.refs)
        return list(out) if target.world_size > 1 else [out]

    def deadline_s(self, cls_name: str, method: str, timeout: float | None) -> float | None:
        """The wait's deadline: the caller's, the pool's `call_timeout_s`, or the history's."""
        if timeout is not None:
            return timeout
        if cls_name == "Host" or method == "__init__":  # start-up (placement, model loading): its own bounds
            return None
        configured = getattr(self.pool, "call_timeout_s", None)
        if configured:
            return float(configured)
        calls, longest = self.history.get((cls_name, method), (0, 0.0))
        return max(HISTORY_MIN_S, HISTORY_FACTOR * longest) if calls >= HISTORY_MIN_CALLS else None

    def _pid(self, rank: int) -> str:
        return f"pid {self.pids[rank]}" if rank < len(self.pids) else "pid unknown"

    def _stopped(self, ranks: list[int], since: dict[int, float]) -> int | None:
        """A rank among `ranks` whose process has been stopped for STOPPED_GRACE_S, else None."""
        now = time.monotonic()
        for r in ranks:
            if r < len(self.pids) and r < len(self.local) and self.local[r] and _proc_state(self.pids[r]) in ("T", "t"):
                if now - since.setdefault(r, now) >= STOPPED_GRACE_S:
                    return r
            else:
                since.pop(r, None)
        return None

    def _fail(self, err: WorkerError, sources: dict[str, Any] | None) -> WorkerError:
        self.pool.mark_broken(str(err))
        origin = (sources or {}).get(err.origin)
        if origin is not None:
            origin.mark_broken(str(err))
        return err

    def wait(self, refs: list[Any], cls_name: str, method: str, ranks: list[int] | None = None,
             timeout: float | None = None, sources: dict[str, Any] | None = None) -> list[Any]:
        """All results in order; raise a WorkerError at the first failure, as it happens (a
        dead rank named as the cause), when a rank is stopped, or past the deadline."""
        ranks = list(range(len(refs))) if ranks is None else ranks
        index = {ref: i for i, ref in enumerate(refs)}
        out: list[Any] = [None] * len(refs)
        t0 = time.monotonic()
        limit = self.deadline_s(cls_name, method, timeout)
        pending, deadline = list(refs), None if limit is None else t0 + limit
        stopped_since: dict[int, float] = {}
        while pending:
            left = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                waiting = [ranks[index[r]] for r in pending]
                stuck = self._stopped(waiting, stopped_since)
                if stuck is not None:
                    raise self._fail(WorkerError(cls_name, stuck, method, (
                        f"its worker process ({self._pid(stuck)}) is stopped (SIGSTOP, or a debugger) and has not run "
                        f"for {STOPPED_GRACE_S:g} s while running {method}(): resume it (kill -CONT "
                        f"{self.pids[stuck]}) or kill it"), self.pool.uid), sources)
                if deadline is not None and time.monotonic() >= deadline:
                    if timeout is not None:  # the caller's own deadline: its TimeoutError, group intact
                        raise TimeoutError(f"{cls_name}.{method}: {len(pending)} rank(s) not done within {timeout} s")
                    who = ", ".join(f"rank {r} ({self._pid(r)})" for r in waiting)
                    raise self._fail(WorkerError(cls_name, waiting[0], method, (
                        f"no answer within {limit:g} s from {who}, running {method}() (deadline: "
                        f"{'call_timeout_s' if getattr(self.pool, 'call_timeout_s', None) else 'history'})"),
                        self.pool.uid), sources)
                continue
            i = index[ready[0]]
            try:
                out[i] = ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - every Ray failure becomes a WorkerError
                raise self._fail(self._explain(e, cls_name, ranks, i, method, pending, index), sources) from None
        calls, longest = self.history.get((cls_name, method), (0, 0.0))
        self.history[(cls_name, method)] = (calls + 1, max(longest, time.monotonic() - t0))
        return out

    def _explain(self, e: Exception, cls_name: str, ranks: list[int], i: int, method: str, pending: list[Any],
                 index: dict[Any, int]) -> WorkerError:
        """The WorkerError of a failed call: if the first failure is not a death, the other
        ranks get CAUSE_GRACE_S to show one (a peer's death surfaces as a survivor's gloo
        error first); a rank that died is the cause, the rest are listed as consequences."""
        first = self._to_worker_error(e, cls_name, ranks[i], method)
        if "the worker process died" in first.detail or not pending:
            return first
        failures = [(first, "raised")]
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=CAUSE_GRACE_S)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as e2:  # noqa: BLE001
                err = self._to_worker_error(e2, cls_name, ranks[index[ref]], method)
                failures.append((err, "died" if "the worker process died" in err.detail else "raised"))
        for ref in pending:
            r = ranks[index[ref]]
            if ref not in ready and r < len(self.local) and self.local[r]:
                state = _proc_state(self.pids[r])
                if state in (None, "Z", "X"):
                    failures.append((WorkerError(cls_name, r, method, f"the worker process died ({self._pid(r)} is "
                                                 f"gone)", self.pool.uid), "died"))
        cause, rest = pick_cause([(kind, err.rank, err) for err, kind in failures])
        err: WorkerError = cause[2]
        if not rest:
            return err
        tail = "\n".join(f"  rank {c[1]}: {str(c[2]).splitlines()[0]}" for c in rest)
        return WorkerError(err.worker_cls, err.rank, err.method,
                           f"{err.detail}\nConsequences (other ranks, after it):\n{tail}", err.origin, err.original)

    def _to_worker_error(self, e: Exception, cls_name: str, rank: int, method: str) -> WorkerError:
        cause = getattr(e, "cause", None)
        if isinstance(cause, WorkerError):  # raised by a HostCore (this group's or a producer's)
            return WorkerError(cause.worker_cls, cause.rank, cause.method, cause.detail, cause.origin, cause.original)
        if isinstance(e, ray.exceptions.RayActorError):
            dead = getattr(e, "actor_id", None)
            if dead is None or self.actor_ranks.get(dead) == rank:
                detail = f"the worker process died ({self._pid(rank)}; {type(e).__name__}):\n{e}"
            else:
                detail = f"an input of this call was lost: another worker process died:\n{e}"
            return WorkerError(cls_name, rank, method, detail, self.pool.uid)
        return WorkerError(cls_name, rank, method, f"{type(e).__name__}: {e}", self.pool.uid)


class RayFuture(Future):
    def __init__(self, backend: RayBackend, cls_name: str, method: str, spec: MethodSpec,
                 refs: list[Any], ranks: list[int], sources: dict[str, Any]) -> None:
        self.backend, self.cls_name, self.method, self.spec = backend, cls_name, method, spec
        self.refs, self.ranks, self.sources = refs, ranks, sources
        self._done, self._value = False, None

    def get(self, timeout: float | None = None) -> Any:
        if not self._done:
            if self.backend.pool.broken and not self.done():  # its ranks may never answer now
                raise WorkerError(self.cls_name, None, self.method, "the group broke before this call "
                                  f"finished. Earlier failure:\n{self.backend.pool.broken}", self.backend.pool.uid)
            outs = self.backend.wait(self.refs, self.cls_name, self.method, self.ranks, timeout,
                                     self.sources)
            topo = self.backend.topo
            self._value = _finish(tuple(outs), self.spec.mode.collect, topo,
                                  self.spec.execute == Execute.RANK_ZERO)
            self._done = True
        return self._value

    def done(self) -> bool:
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0, fetch_local=False)
        return len(ready) == len(self.refs)

    def __repr__(self) -> str:
        return f"RayFuture({self.cls_name}.{self.method}, ranks={self.ranks}, done={self.done()})"


__all__ = ["ensure_ray", "shutdown_ray", "RayBackend", "RayFuture"]
