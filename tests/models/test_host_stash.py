"""`baton.models.host_stash`: the optimizer state's offload copies each tensor once, into a
host buffer allocated on the first offload and reused after (before issue 43: a pageable
copy, then a pinned copy of it, both new each update); values round-trip exactly, a
DTensor's shard too. Page-locked memory needs CUDA: its one call (`host_empty` with
pinned=True) is mocked where the pinned path is checked on the CPU."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import baton.models.host_stash as hs
from baton.models.host_stash import HostStash
from baton.models.parallel import move_optimizer_state


class Ops(TorchDispatchMode):
    """Records (op name, non_blocking) of every op run."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        nb = bool(kwargs.get("non_blocking", args[2] if func is torch.ops.aten.copy_.default and len(args) > 2 else False))
        self.ops.append((str(func.overloadpacket.__name__), nb))
        return func(*args, **kwargs)


def test_one_copy_into_a_buffer_allocated_once_and_exact_round_trips():
    stash = HostStash(pinned=False)
    g = torch.Generator().manual_seed(0)
    state = torch.randn(5, 3, generator=g)
    with Ops() as rec:
        first = stash.to_host(("p", "exp_avg"), state)
    assert [op for op, _ in rec.ops] == ["empty", "copy_"]  # allocated, copied: nothing else
    assert torch.equal(first, state) and first.untyped_storage().data_ptr() != state.untyped_storage().data_ptr()
    for _ in range(3):  # later offloads: the same buffer, one copy each
        state = torch.randn(5, 3, generator=g, dtype=torch.float32)
        with Ops() as rec:
            again = stash.to_host(("p", "exp_avg"), state)
        assert [op for op, _ in rec.ops] == ["copy_"]
        assert again.data_ptr() == first.data_ptr() and torch.equal(again, state)
    assert stash.allocations == 1
    stash.to_host(("p", "exp_avg"), torch.zeros(2, 3))  # a new shape (a loaded state): a new buffer
    stash.to_host(("q", "exp_avg"), torch.zeros(5, 3))
    assert stash.allocations == 3


def test_pinned_buffers_are_asked_for_once_and_filled_without_blocking(monkeypatch):
    """The pinned path on the CPU: `host_empty` is CUDA-only with pinned=True, so it is a
    mock here (a plain tensor, the request recorded); the copy is the real one."""
    asked = []

    def fake_host_empty(like, pinned):  # mock of the CUDA-only page-locked allocation
        asked.append(pinned)
        return torch.empty(like.shape, dtype=like.dtype)

    monkeypatch.setattr(hs, "host_empty", fake_host_empty)
    stash = HostStash(pinned=True)
    t = torch.arange(6.0)
    with Ops() as rec:
        for _ in range(2):
            out = stash.to_host("k", t)
    assert asked == [True] and rec.ops == [("empty", False), ("copy_", True), ("copy_", True)]
    assert torch.equal(out, t)
    assert HostStash().pinned == torch.cuda.is_available()


def test_a_dtensor_shard_round_trips_with_its_layout():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    own = not dist.is_initialized()  # a 1-rank group an earlier test of this process made will do
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert dist.get_world_size() == 1
        mesh = init_device_mesh("cpu", (1,))
        full = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
        d = distribute_tensor(full, mesh, [Shard(0)])
        stash = HostStash(pinned=False)
        out = stash.to_host("k", d)
        assert out.placements == d.placements and out.shape == d.shape
        assert torch.equal(out.full_tensor(), full)
        assert out.to_local().data_ptr() == stash.buffers["k"].data_ptr()
    finally:
        if own:
            dist.destroy_process_group()


def test_on_the_cpu_optimizer_offload_moves_nothing():
    """On the CPU the state is where offload puts it: nothing moves, no buffer is made."""
    model = torch.nn.Linear(3, 2)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optim.step()
    stash = HostStash(pinned=False)
    assert move_optimizer_state(optim, "cpu", stash) == 0 and stash.allocations == 0
