"""Worker classes used by the controller tests (importable by Ray worker processes, which
get the driver's sys.path)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from baton.batch import Batch
from baton.controller import Dispatch, Execute, Worker, register


class EchoWorker(Worker):
    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.last_chunk: Batch | None = None
        # The process group and mesh exist before user code runs: a collective in __init__ works.
        t = torch.ones(1)
        dist.all_reduce(t)
        self.init_world = int(t.item())

    @register
    def info(self) -> dict:
        return dict(rank=self.rank, world_size=self.world_size, dp_rank=self.dp_rank, dp_size=self.dp_size,
                    tp_rank=self.tp_rank, pid=os.getpid(), device=str(self.device), init_world=self.init_world,
                    mesh_tp=self.mesh.get_local_rank("tp"), mesh_dims=self.mesh.mesh_dim_names)

    @register
    def add(self, x: int, y: int = 0) -> int:
        return x + y + self.rank

    @register(dispatch=Dispatch.ALL_TO_ALL)
    def times_rank(self, x: int) -> int:
        return x * (self.rank + 1)

    @register(execute=Execute.RANK_ZERO)
    def only_zero(self, x: int) -> tuple[int, int]:
        return (self.rank, x)

    @register
    def all_reduce_rank(self) -> float:
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return t.item()

    @register(dispatch=Dispatch.DP_COMPUTE)
    def double(self, batch: Batch) -> Batch:
        self.last_chunk = batch
        out = Batch({"x": batch["x"] * 2 * self.scale, "rank": torch.full((len(batch),), self.rank)},
                    {"tag": [f"{t}!" for t in batch["tag"]]} if "tag" in batch else {})
        return out

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)
    def double_async(self, batch: Batch) -> Batch:
        return self.double(batch)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def count(self, batch: Batch, items: list) -> tuple[int, object]:
        return (len(batch), items)

    @register
    def last_rows(self) -> list:
        return self.last_chunk["x"].flatten().tolist()

    @register
    def total(self, batch: Batch) -> float:  # ONE_TO_ALL: every rank sees the whole batch
        return float(batch["x"].sum())

    @register(blocking=False)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad value on purpose in rank {self.rank}")
        return self.rank

    @register(blocking=False)
    def collective_after(self, delays: list) -> float:
        time.sleep(delays[self.rank])
        t = torch.ones(1)
        dist.all_reduce(t)  # blocks while a peer is missing
        return t.item()


class Actor(Worker):
    def __init__(self, dim: int = 4) -> None:
        self.weight = torch.arange(float(dim))

    @register
    def pid(self) -> int:
        return os.getpid()

    @register
    def bump(self) -> None:
        self.weight += 1  # in place: a colocated sibling sees it without any copy

    @register(blocking=False)
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class Ref(Worker):
    def __init__(self) -> None:
        # Colocated roles are built in order, so the actor already exists here.
        self.actor_ptr = self.sibling("actor").weight.data_ptr()

    @register
    def pid(self) -> int:
        return os.getpid()

    @register
    def read_actor(self) -> tuple[list, bool]:
        w = self.sibling("actor").weight
        return w.tolist(), w.data_ptr() == self.actor_ptr

    @register
    def try_sibling(self, role: str) -> str:
        try:
            self.sibling(role)
        except LookupError as e:
            return str(e)
        return "found"


class Reward(Worker):
    @register
    def pid(self) -> int:
        return os.getpid()

    @register(blocking=False)
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds
