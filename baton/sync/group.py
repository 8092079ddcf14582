"""A stand-alone torch.distributed group for weight updates, plus the bucketed broadcast.

The trainer (rank 0) and the inference engines (ranks 1..W-1) form a group of their own,
outside any default process group: the trainer may already live in a torchrun/FSDP world
and the server has none. So we build the ProcessGroup object directly from a TCPStore
(the same idea as vLLM's `StatelessProcessGroup`) and call its collectives as methods,
never through `torch.distributed.broadcast(group=...)`, which needs a registered group.

Bucketing: many small tensors cost one collective each. `plan_buckets` packs consecutive
tensors of one dtype into flat buffers of about `bucket_bytes`; sender and receiver run the
same deterministic plan from the same (name, dtype, shape) list, so only that list crosses
HTTP and the bytes go through the collective. `bucket_bytes=None` sends one tensor per
broadcast, which is what SGLang's `/update_weights_from_distributed` expects.

Digests (issue 49): where no request carries them (a generator's group with the actor), rank 0
records each full tensor's digest as it sends it and broadcasts them after the last bucket
(`send_digests` / `receive_digests`); the receiver checks before it installs.
"""

from __future__ import annotations

import datetime
import ipaddress
import math
import os
import socket
from typing import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from baton.sync.digest import DIGEST_BYTES, tensor_digest

DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's default name


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: the spelling SGLang puts in `dtypes`."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback (localhost, 127.x, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class WeightUpdateGroup:
    """One rank of a weight-update group. Rank 0 (the trainer) hosts the TCPStore.

    Every rank must construct its group at about the same time: the constructor returns
    once all `world_size` ranks have joined (or raises after `timeout_s`).
    """

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int, *,
                 backend: str = "gloo", group_name: str = DEFAULT_GROUP_NAME, timeout_s: float = 600.0,
                 listen_socket: socket.socket | None = None, device: torch.device | str | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise ValueError("backend 'nccl' needs CUDA and a torch build with NCCL; use 'gloo' on CPU")
        self.rank, self.world_size, self.backend, self.group_name = rank, world_size, backend, group_name
        timeout = datetime.timedelta(seconds=timeout_s)
        listen_fd = None
        if rank == 0:
            # Bind the store's socket ourselves so it listens on master_address only
            # (TCPStore alone binds every interface). A caller may pre-bind it (port 0) to
            # learn the port before any rank starts joining.
            sock = listen_socket or socket.create_server((master_address, master_port), backlog=128)
            listen_fd = sock.detach()  # the store owns (and closes) the fd from here on
        try:
            store = dist.TCPStore(master_address, master_port, world_size, rank == 0, timeout=timeout,
                                  wait_for_workers=False, master_listen_fd=listen_fd)
        except BaseException:
            if listen_fd is not None:
                os.close(listen_fd)
            raise
        self._store = store  # the PG keeps using it; hold a reference
        prefixed = dist.PrefixStore(f"baton/{group_name}", store)
        if backend == "gloo":
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            # Loopback groups (tests, one machine) must not depend on hostname resolution.
            dev = (dist.ProcessGroupGloo.create_device(hostname="127.0.0.1") if is_loopback(master_address)
                   else dist.ProcessGroupGloo.create_default_device())
            opts._devices = [dev]
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world_size, opts)
            self.device = torch.device("cpu")
        else:
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
            # the CUDA device this rank's NCCL communicator lives on (the engine's, not
            # whatever the calling thread has current)
            device = torch.device(device) if device is not None else torch.device("cuda")
            self.device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """In-place broadcast from `src` (blocking; on NCCL ordered on the current stream)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                self.pg.broadcast([tensor], opts).wait()
        else:
            self.pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        try:
            if hasattr(self.pg, "shutdown"):
                self.pg.shutdown()
        except Exception:  # best effort: a peer may already be gone
            pass
        self.pg = None
        self._store = None


# --- bucketing ----------------------------------------------------------------------

Spec = tuple[str, str, Sequence[int]]  # (name, dtype name, shape)


def plan_buckets(specs: Sequence[Spec], bucket_bytes: int | None) -> list[list[int]]:
    """Group spec indices into buckets: consecutive, one dtype, <= bucket_bytes (a tensor
    larger than that gets a bucket of its own). None/0 -> one tensor per bucket."""
    if not bucket_bytes:
        return [[i] for i in range(len(specs))]
    buckets: list[list[int]] = []
    cur: list[int] = []
    cur_bytes, cur_dtype = 0, None
    for i, (_, dt, shape) in enumerate(specs):
        nbytes = math.prod(shape) * parse_dtype(dt).itemsize
        if cur and (dt != cur_dtype or cur_bytes + nbytes > bucket_bytes):
            buckets.append(cur)
            cur, cur_bytes = [], 0
        cur.append(i)
        cur_bytes += nbytes
        cur_dtype = dt
    if cur:
        buckets.append(cur)
    return buckets


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter's full value - an all-gather over its mesh, which every
    trainer rank must run in the same order - or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def send_buckets(group: WeightUpdateGroup, tensors: Sequence[torch.Tensor], plan: list[list[int]],
                 digests: dict[int, str] | None = None) -> None:
    """Trainer side: broadcast `tensors` (from rank 0) bucket by bucket. Sharded (DTensor)
    tensors are gathered bucket by bucket as they are sent, so at most one bucket of full
    tensors exists at a time; the trainer's other ranks run `gather_buckets` alongside.
    `digests`: filled with {tensor index: digest} of the full tensors as sent (for
    `send_digests`)."""
    for bucket in plan:
        full = [full_tensor(tensors[i].detach()) for i in bucket]
        if digests is not None:
            digests.update((i, tensor_digest(t)) for i, t in zip(bucket, full))
        if len(bucket) == 1:
            buf = full[0].to(group.device).contiguous()  # no copy when already there and contiguous
        else:
            buf = torch.cat([t.to(group.device).reshape(-1) for t in full])  # [sum numel]
        group.broadcast(buf, src=0)


def send_digests(group: WeightUpdateGroup, digests: Sequence[str]) -> None:
    """After the buckets, in the same group: each tensor's digest (`baton.sync.digest`), in
    spec order, as DIGEST_BYTES bytes each, so a receiver can check what it got before it
    installs any of it (`receive_digests`)."""
    raw = b"".join(bytes.fromhex(d) for d in digests)
    group.broadcast(torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(group.device), src=0)


def receive_digests(group: WeightUpdateGroup, specs: Sequence[Spec]) -> dict[str, str]:
    """The digests `send_digests` broadcast: {name: digest} of every spec."""
    buf = torch.empty(len(specs) * DIGEST_BYTES, dtype=torch.uint8, device=group.device)
    group.broadcast(buf, src=0)
    raw = bytes(buf.cpu().numpy())
    return {spec[0]: raw[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES].hex() for i, spec in enumerate(specs)}


def gather_buckets(tensors: Sequence[torch.Tensor], plan: list[list[int]]) -> None:
    """A sharded trainer's ranks other than 0: the gathers `send_buckets` runs on rank 0, in
    the same order, with nothing sent (their results are dropped at once)."""
    for bucket in plan:
        for i in bucket:
            full_tensor(tensors[i].detach())


def receive_buckets(group: WeightUpdateGroup, specs: Sequence[Spec], plan: list[list[int]],
                    device: torch.device | str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Engine side: yield (name, tensor) as each bucket arrives, so at most one bucket is
    in flight in memory; the consumer (engine.update_weights) copies each into place."""
    comm_device = group.device
    for bucket in plan:
        dt = parse_dtype(specs[bucket[0]][1])
        sizes = [math.prod(specs[i][2]) for i in bucket]
        buf = torch.empty(sum(sizes), dtype=dt, device=comm_device)  # [sum numel]
        group.broadcast(buf, src=0)
        if device is not None and torch.device(device) != comm_device:
            buf = buf.to(device)
        for i, part in zip(bucket, torch.split(buf, sizes)):
            yield specs[i][0], part.view(*specs[i][2])


def drain(it: Iterable) -> None:
    """Consume the rest of a receive iterator so the collective sequence completes even if
    the consumer failed half way (otherwise the trainer blocks until its timeout)."""
    for _ in it:
        pass
