"""The weight broadcast's backend follows where its ends' tensors live (`baton.sync.backend`):
NCCL only between distinct GPUs, gloo otherwise, a refusal naming the fix when NCCL is asked
for where it cannot run. Regression: `BroadcastSync` picked NCCL whenever CUDA was visible
(the trainer and a server on one GPU: NCCL refuses the duplicate device; a CPU actor on a
GPU machine handed NCCL CPU tensors). The CUDA runs are tests/gpu/."""

from __future__ import annotations

import pytest
import torch

from baton.controller import ResourcePool
from baton.sync.backend import End, choose_backend, end_of
from baton.sync.broadcast import pool_end

CPU, UNKNOWN = End("cpu"), End("unknown")
A, B = End("cuda", "GPU-a"), End("cuda", "GPU-b")


@pytest.mark.parametrize("sender, receivers, backend", [
    (A, [B], "nccl"),  # two GPUs of their own
    (A, [B, End("cuda", "GPU-c")], "nccl"),
    (A, [A], "gloo"),  # the trainer and a server on one GPU (`baton launch` on a one-GPU machine)
    (A, [B, B], "gloo"),  # two servers on one GPU
    (CPU, [B], "gloo"),  # a CPU actor on a GPU machine
    (A, [CPU], "gloo"),
    (CPU, [CPU], "gloo"),
    (A, [End("cuda")], "gloo"),  # a GPU nobody named: cannot tell it from A's
    (A, [UNKNOWN], "gloo"),  # a server that does not say where its weights are
])
def test_the_backend_follows_the_ends(sender, receivers, backend):
    assert choose_backend(sender, receivers) == backend
    assert choose_backend(sender, receivers, "gloo") == "gloo"  # gloo runs everywhere


@pytest.mark.parametrize("sender, receivers", [(A, [A]), (CPU, [B]), (A, [UNKNOWN])])
def test_nccl_where_it_cannot_run_is_one_line_naming_the_fix(sender, receivers):
    with pytest.raises(ValueError, match="needs each end on a GPU of its own") as e:
        choose_backend(sender, receivers, "nccl")
    assert "\n" not in str(e.value) and "gloo" in str(e.value)
    with pytest.raises(ValueError, match="'nccl' or 'gloo'"):
        choose_backend(A, [B], "mpi")


def test_ends_of_devices_and_pools():
    assert end_of("cpu") == CPU and end_of(None) == UNKNOWN
    gpu = ResourcePool(2, backend="ray", gpus_per_worker=1)
    cpu = ResourcePool(2, backend="ray")
    assert pool_end(cpu, 0) == CPU
    assert len({pool_end(gpu, 0), pool_end(gpu, 1)}) == 2  # each slot its own GPU, named the same everywhere
    generator = ResourcePool(1, backend="ray", gpus_per_worker=1)
    assert choose_backend(pool_end(gpu, 0), [pool_end(generator, 0)]) == "nccl"
    assert choose_backend(pool_end(cpu, 0), [pool_end(generator, 0)]) == "gloo"
    local = [ResourcePool(1, backend="local", gpus_per_worker=1) for _ in range(2)]  # one process, one GPU
    assert choose_backend(pool_end(local[0], 0), [pool_end(local[1], 0)]) == "gloo"


def test_a_cpu_broadcast_stays_on_gloo_where_cuda_is_visible(tiny_qwen, start_server, monkeypatch):
    """A server on the CPU says so (/get_model_info); the trainer's tensors are on the CPU:
    gloo, though CUDA is visible (patched: what the old choice looked at)."""
    from baton.rollout.remote import RemoteEngine
    from baton.sync import BroadcastSync

    url, _ = start_server()
    server = RemoteEngine(url)
    assert server.weights_end() == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    sync = BroadcastSync([server], bucket_mb=1, timeout_s=60, device="cpu")
    try:
        assert sync.backend == "gloo"
        sync.push(tiny_qwen(1).named_parameters(), 1)
    finally:
        sync.close()
