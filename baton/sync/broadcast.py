"""Weight sync by torch.distributed broadcast: trainer rank 0 -> engine processes.

Handshake (SGLang's protocol; the engine side is `WeightReceiver`, which `baton serve`
exposes over HTTP and which any engine host, e.g. a Ray actor, can embed):
  1. the trainer asks every engine to `init_weights_update_group(master_address,
     master_port, rank_offset, world_size, group_name, backend)` and joins the same group
     as rank 0 (engine i gets rank 1 + i * ranks_per_engine);
  2. per push, it tells every engine the (names, dtypes, shapes) it is about to send, then
     broadcasts the tensors, packed into flat buckets of ~bucket_mb (both sides derive the
     same plan from the list, see `baton.sync.group.plan_buckets`), and waits for every
     engine to confirm it loaded them.
The backend follows where the tensors live (`baton.sync.backend.choose_backend`): NCCL
between distinct GPUs only, gloo otherwise (CPU ends, one GPU shared by the trainer and a
server, a server that does not say where its weights are). With `bucket_mb=0` tensors go one
per broadcast, which is what a real SGLang server expects.

One trainer per engine: while a weight-update group is set up (or being set up) the
receiver refuses another (`AlreadyHasTrainer`, which `baton serve` answers with 409), and
the trainer's `BroadcastSync` waits for its own rendezvous and the engines' answers
together, so a second trainer is told within seconds which server already has a trainer
(before: it waited in the rendezvous for the group timeout).

A sharded trainer (fsdp2 / tp: DTensor parameters) pushes its parameters as they are
(`module.named_parameters()`): the specs come from their global shapes, and each bucket's
tensors are gathered just before it is sent, so no full copy of the model is ever built;
the trainer's other ranks call `BroadcastSync.participate(named_params, bucket_mb)` at the
same time to take part in those gathers.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Iterable, Sequence

import torch

from baton.sync.backend import End, choose_backend, end_of
from baton.sync.delta import Held, StaleBase, check_base, installed_as, weights_id
from baton.sync.digest import WeightDigestError, check_digests, staged
from baton.sync.group import (DEFAULT_GROUP_NAME, WeightUpdateGroup, drain, dtype_name, gather_buckets,
                              parse_dtype, plan_buckets, receive_buckets, receive_digests, send_buckets)


class AlreadyHasTrainer(ValueError):
    """An engine asked to join a weight-update group while it has one (or is joining one).
    A ValueError: no retry helps (`baton.workers.server_sync` re-raises those at once)."""


class WeightReceiver:
    """Engine side of a broadcast sync: owns the engine's weight-update group (one trainer)."""

    def __init__(self, engine, rank_in_engine: int = 0):
        self.engine = engine
        self.rank_in_engine = rank_in_engine  # a tensor-parallel engine's local rank; 0 here
        self.groups: dict[str, WeightUpdateGroup] = {}
        self._trainer: tuple[str, str, float] | None = None  # (group, master host:port, since) set up or joining
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str | None:
        return self.engine.base_url  # None: an engine in this process

    @property
    def partial_weight_updates(self) -> bool:
        return self.engine.partial_weight_updates

    def served_version(self) -> int | None:
        return self.engine.served_version()

    def weights_end(self) -> End:
        """Where the engine's weights live (the trainer picks the backend from it)."""
        return end_of(self.engine.device)

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = DEFAULT_GROUP_NAME, backend: str = "gloo",
                                  timeout_s: float = 600.0) -> None:
        if rank_offset < 1:
            raise ValueError("rank_offset must be >= 1: rank 0 is the trainer")
        with self._lock:
            if self._trainer is not None and self._trainer[0] in self.groups and not _reachable(self._trainer[1]):
                self.groups.pop(self._trainer[0]).close()  # its trainer is gone (its store no longer listens)
                self._trainer = None
            if self._trainer is not None:
                name, master, since = self._trainer
                state = "has" if name in self.groups else "is joining"
                raise AlreadyHasTrainer(
                    f"this server already has a trainer: it {state} weight update group {name!r} of the trainer at "
                    f"{master} (since {time.monotonic() - since:.0f} s); that trainer must leave it "
                    f"(/destroy_weights_update_group) before another can join")
            self._trainer = (group_name, f"{master_address}:{master_port}", time.monotonic())
        try:
            self.groups[group_name] = WeightUpdateGroup(
                master_address, master_port, rank_offset + self.rank_in_engine, world_size, backend=backend,
                group_name=group_name, timeout_s=timeout_s, device=self.engine.device)
        except BaseException:
            self._trainer = None
            raise

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], version: int,
                                        group_name: str = DEFAULT_GROUP_NAME, bucket_bytes: int | None = None,
                                        digests: dict[str, str] | None = None, weights: str | None = None,
                                        base_weights: str | None = None) -> None:
        """Receive the broadcast described by (names, dtypes, shapes) and load it. Blocks
        until the trainer has sent every bucket. `digests` ({name: digest} of what the trainer
        sent): every tensor is checked against it before any is installed; a mismatch raises
        `WeightDigestError` naming the tensor, after the broadcast completed (the group stays
        usable) and with the engine's weights and version untouched. `weights`: the identity of
        the whole set after this push (`baton.sync.delta.weights_id`), kept by the engine;
        `base_weights`: the tensors are a delta on that set: refused (`StaleBase`) unless the
        engine holds it."""
        group = self.groups.get(group_name)
        if group is None:
            raise ValueError(f"no weight update group {group_name!r}: call init_weights_update_group first")
        specs = validate_specs(names, dtypes, shapes)
        plan = plan_buckets(specs, bucket_bytes)
        device = self.engine.device
        it = receive_buckets(group, specs, plan, device=device)
        try:
            tensors = it if digests is None else staged(it, digests)
            if base_weights is not None:  # a delta: received (and checked) whole, then its base checked
                tensors = list(tensors)
                check_base(self.engine, base_weights)
            self.engine.update_weights(tensors, version)
            installed_as(self.engine, weights)
        finally:
            drain(it)  # if the engine rejected a name, still complete the collectives

    def receive_checked(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
                        version: int, group_name: str = DEFAULT_GROUP_NAME, bucket_bytes: int | None = None) -> None:
        """Receive the buckets of (names, dtypes, shapes), then their digests in the same group
        (`send_buckets` + `send_digests`: a generator's group with the actor, where no request
        carries them), check every tensor, then install: a mismatch raises `WeightDigestError`
        naming the tensor after the last collective, the engine's weights and version kept."""
        group = self.groups.get(group_name)
        if group is None:
            raise ValueError(f"no weight update group {group_name!r}: call init_weights_update_group first")
        specs = validate_specs(names, dtypes, shapes)
        received = list(receive_buckets(group, specs, plan_buckets(specs, bucket_bytes),
                                        device=self.engine.device))
        check_digests(received, receive_digests(group, specs))
        self.engine.update_weights(received, version)
        installed_as(self.engine, None)

    def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP_NAME) -> None:
        group = self.groups.pop(group_name, None)
        if group is None:
            raise ValueError(f"no weight update group {group_name!r}")
        self._trainer = None
        group.close()

    def close(self) -> None:
        for name in list(self.groups):
            self.groups.pop(name).close()
        self._trainer = None


def validate_specs(names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]):
    """(name, dtype, shape) triples; ValueError naming the problem if the lists disagree."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError(f"names, dtypes and shapes must have one entry per tensor "
                         f"(got {len(names)}, {len(dtypes)}, {len(shapes)})")
    for name, dt, shape in zip(names, dtypes, shapes):
        parse_dtype(dt)
        if any(int(d) < 0 for d in shape):
            raise ValueError(f"negative dimension in shape of {name!r}: {list(shape)}")
    return [(n, dt, [int(d) for d in s]) for n, dt, s in zip(names, dtypes, shapes)]


class BroadcastSync:
    """Trainer side. `engines`: objects with the `WeightReceiver` methods: a
    `baton.rollout.remote.RemoteEngine` for a server, a `WeightReceiver` in process, or a
    handle to an engine actor. (A bare URL is refused: this layer does not speak HTTP.)
    `device`: where the pushed tensors live (the trainer's device; None: the CPU);
    `backend`: None picks it from both ends (`choose_backend`), else "nccl" / "gloo"."""

    def __init__(self, engines, *, master_address: str = "127.0.0.1", master_port: int = 0,
                 bucket_mb: float = 64.0, backend: str | None = None, group_name: str = DEFAULT_GROUP_NAME,
                 ranks_per_engine: int = 1, timeout_s: float = 600.0, cast_dtype: torch.dtype | None = None,
                 device: torch.device | str | None = "cpu", delta: bool = True):
        engines = list(engines) if isinstance(engines, (list, tuple)) else [engines]
        urls = [e for e in engines if isinstance(e, str)]
        if urls:
            raise TypeError(f"BroadcastSync takes engine objects, not URLs ({urls[0]!r}): "
                            f"wrap it as baton.rollout.remote.RemoteEngine(url)")
        self.engines = engines
        receivers = [e.weights_end() for e in engines]
        self.backend = choose_backend(end_of(device), receivers, backend)
        self.bucket_bytes = int(bucket_mb * 2**20) or None
        self.group_name = group_name
        self.cast_dtype = cast_dtype  # e.g. bf16 on the wire for an fp32 trainer
        self.held = Held(delta)  # what the engines hold: a push sends only what changed (baton.sync.delta)
        self.last: dict[str, float] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.engines)), thread_name_prefix="baton-sync")
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baton-sync-send")
        self._broken: str | None = None
        world_size = 1 + ranks_per_engine * len(self.engines)
        # Bind first (port 0 = any free one) so the engines learn the port before anyone joins.
        sock = socket.create_server((master_address, master_port), backlog=128)
        port = sock.getsockname()[1]
        futures = [self._pool.submit(e.init_weights_update_group, master_address, port, 1 + i * ranks_per_engine,
                                     world_size, group_name, self.backend)
                   for i, e in enumerate(self.engines)]
        # Our rank 0 joins on a daemon thread, so an engine that refuses (it has a trainer, a
        # bad request) is an error now, not after the rendezvous' timeout. (The abandoned
        # rendezvous thread ends at that timeout; a daemon thread does not hold up exit.)
        joined: Future = Future()

        def rendezvous() -> None:
            try:
                joined.set_result(WeightUpdateGroup(master_address, port, 0, world_size, backend=self.backend,
                                                    group_name=group_name, timeout_s=timeout_s, listen_socket=sock))
            except BaseException as exc:  # noqa: BLE001 - handed to the constructor's thread
                sock.close()
                joined.set_exception(exc)

        threading.Thread(target=rendezvous, daemon=True, name="baton-sync-rendezvous").start()
        wait([joined, *futures], return_when=FIRST_EXCEPTION)
        for e, f in zip(self.engines, futures):
            if f.done() and f.exception() is not None:
                self._pool.shutdown(wait=False)
                self._sender.shutdown(wait=False)
                exc = f.exception()
                status, reason = _refusal(exc)
                error = AlreadyHasTrainer if status == 409 or isinstance(exc, AlreadyHasTrainer) else RuntimeError
                raise error(f"weight sync: {_engine_name(e)} did not join the weight update group: {reason}") from exc
        self.group = joined.result()
        for f in futures:
            f.result()

    def push(self, named_params: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Broadcast the weights as `version`: only the tensors changed since the version every
        engine serves (`baton.sync.delta`; all of them otherwise, or with `delta=False`), with
        their digests; `last` says what moved ("sync/bytes", "sync/seconds", "sync/tensors")."""
        named = [(n, t if self.cast_dtype is None else t.to(self.cast_dtype)) for n, t in named_params]
        if self._broken is not None:
            raise RuntimeError(f"weight update group is broken by an earlier failure ({self._broken}); "
                               "close this BroadcastSync and create a new one")
        self.last = self.held.push(self.engines, named, version, self._push)

    def _push(self, named: list[tuple[str, torch.Tensor]], every: dict[str, str], version: int,
              base_weights: str | None) -> None:
        names = [n for n, _ in named]
        dtypes = [dtype_name(t.dtype) for _, t in named]
        shapes = [list(t.shape) for _, t in named]
        plan = plan_buckets(list(zip(names, dtypes, shapes)), self.bucket_bytes)
        sent = {n: every[n] for n in names}
        futures = [self._pool.submit(e.update_weights_from_distributed, names, dtypes, shapes, version,
                                     self.group_name, self.bucket_bytes, digests=sent, weights=weights_id(every),
                                     **({} if base_weights is None else {"base_weights": base_weights}))
                   for e in self.engines]
        # Send on a thread of its own: if an engine rejects the request it never posts its
        # receives and our broadcast would block until the group timeout; this way the
        # engine's error surfaces at once.
        futures.append(self._sender.submit(_send, self.group, [t for _, t in named], plan))
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for e, f in zip(self.engines, futures):
            if f.done() and f.exception() is not None and _refused_whole(f.exception()):
                # every bucket was received (the engine checks after the last): the group is intact
                wait(futures)
                error = StaleBase if "a delta on weights" in str(f.exception()) else WeightDigestError
                raise error(f"weight broadcast (version {version}) refused by {_engine_name(e)}: "
                            f"{_refusal(f.exception())[1]}") from f.exception()
        for f in done:
            if f.exception() is not None:
                self._broken = repr(f.exception())
                raise RuntimeError(f"weight broadcast (version {version}) failed: {f.exception()}") from f.exception()

    @staticmethod
    @torch.no_grad()
    def participate(named_params: Iterable[tuple[str, torch.Tensor]], bucket_mb: float = 64.0,
                    cast_dtype: torch.dtype | None = None) -> None:
        """On a sharded trainer's ranks other than 0, while rank 0 runs `push` with the same
        tensors and settings: the per-bucket gathers, in the same order (nothing is sent)."""
        named = [(n, t if cast_dtype is None else t.to(cast_dtype)) for n, t in named_params]
        specs = [(n, dtype_name(t.dtype), list(t.shape)) for n, t in named]
        gather_buckets([t for _, t in named], plan_buckets(specs, int(bucket_mb * 2**20) or None))

    def close(self) -> None:
        for e in self.engines:
            try:
                e.destroy_weights_update_group(self.group_name)
            except Exception:  # the engine may be gone; the group dies with it
                pass
        self.group.close()
        self._pool.shutdown(wait=False)
        self._sender.shutdown(wait=False)


def _engine_name(engine) -> str:
    return engine.base_url or type(engine).__name__


def _refused_whole(exc: BaseException) -> bool:
    """An engine received the whole broadcast and refused it: not what was sent, or a delta on
    a version it does not serve (in process, or a server's 409)."""
    return isinstance(exc, (WeightDigestError, StaleBase)) or (
        _refusal(exc)[0] == 409 and ("digest" in str(exc) or "a delta on weights" in str(exc)))


def _refusal(exc: BaseException) -> tuple[int | None, str]:
    """(HTTP status, reason) an engine gave: a server's status and JSON `message`
    (`RemoteEngineError` carries "POST url -> status: body"), else (None, the exception's text)."""
    m = re.search(r"-> (\d+): (\{.*\})\s*$", str(exc), re.S)
    if m:
        try:
            return int(m.group(1)), f"{json.loads(m.group(2)).get('message')} (HTTP {m.group(1)})"
        except (ValueError, AttributeError):
            pass
    return None, str(exc)


def _reachable(address: str, timeout_s: float = 2.0) -> bool:
    """Does something listen at host:port (a trainer's TCPStore)? Refused: no; a timeout
    counts as yes (a busy or firewalled trainer keeps its server)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return False
    except OSError:
        return True
    return True


@torch.no_grad()
def _send(group: WeightUpdateGroup, tensors: list[torch.Tensor], plan: list[list[int]]) -> None:
    send_buckets(group, tensors, plan)


class GeneratorBroadcast:
    """Driver side, for a generator on its own pool: a group of actor rank 0 (the
    `WeightsWorker` group `weights`) and every generator rank (`GeneratorWorker` group
    `rollout`): NCCL when both pools have GPUs (distinct ones: a GPU belongs to one pool
    slot), else gloo (`choose_backend`). `push(version)` queues the
    receive on the generator and the send on the actor; they meet in the collective, so the
    actor waits until the generator has finished what was queued before (returns both futures)."""

    def __init__(self, rollout, *, weights):
        self.rollout, self.weights = rollout, weights
        backend = choose_backend(pool_end(weights.pool, 0), [pool_end(rollout.pool, r) for r in range(rollout.world_size)])
        address, port, self.specs = weights.open_weight_group()  # (names, dtypes, shapes), fixed for the run
        world = 1 + rollout.world_size
        joined = rollout.submit("join_weight_group", address, port, world, backend)  # another process
        weights.join_weight_group(world, backend)
        joined.get()

    def push(self, version: int) -> list:
        return [self.rollout.submit("receive_weights", self.specs, version), self.weights.submit("send_weights")]

    def close(self) -> None:
        pass  # the groups go with the pools' processes


def pool_end(pool, rank: int) -> End:
    """The `End` of a pool slot's tensors: its own GPU when the pool has GPUs (named by the
    slot: a Ray process sees its GPU as cuda:0; the local backend runs every pool in the
    driver's process, on one GPU), else the CPU."""
    if not getattr(pool, "gpus_per_worker", 0):
        return End("cpu")
    return End("cuda", "local" if pool.backend_name == "local" else f"{pool.uid}/{rank}")
