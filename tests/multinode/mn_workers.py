"""Workers for the multi-node tests: each reports where it runs and takes part in a collective."""

from __future__ import annotations

import os
import time

import ray
import torch
import torch.distributed as dist

from baton.controller import Dispatch, Worker, register


class NodeWorker(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def where(self) -> dict:
        return {"node": ray.get_runtime_context().get_node_id(), "rank": self.rank, "local_rank": self.local_rank,
                "master": os.environ.get("MASTER_ADDR"), "pid": os.getpid()}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank
