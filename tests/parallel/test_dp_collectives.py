"""Data parallel with few collectives (baton.models.parallel.sync_grads, optimizer_steps).

On two real gloo ranks (two processes): the gradient all-reduce carries an extra element
summed with the gradients; a non-finite loss on one rank only skips the optimizer step on
both (the verdict rides on that all-reduce); and an actor update of k optimizer steps
runs k + 2 all-reduces (the k gradient all-reduces, the normalisers of the whole pass, the
loss metric), not 3k; the gradient buckets are launched during the backward (overlapped)
and sum bit for bit to what one flat all-reduce gives, with the gradients accumulated
straight into the buckets (views of them; earlier micro-batches' sums carried in, a
parameter without a gradient left None).
"""

from __future__ import annotations

import math
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from baton.models.parallel import wrap
from baton.workers.optimizer_steps import OptimizerSteps, all_finite, finite_flag


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if dist.is_initialized():  # forked from a pytest process where a local run made its 1-rank group
        dist.destroy_process_group()
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, 1, 1), mesh_dim_names=("dp", "fsdp", "tp"))
        model = nn.Linear(2, 1, bias=False).double()
        with torch.no_grad():
            model.weight.copy_(torch.tensor([[1.0, -1.0]]))
        par = wrap(model, mesh, "ddp")
        model.weight.grad = torch.full_like(model.weight, float(rank + 1))  # 1 and 2
        summed = par.sync_grads(extra=torch.tensor([10.0 * (rank + 1)], dtype=torch.float64))
        out = {"grad": model.weight.grad.tolist(), "extra": summed.tolist()}
        model.weight.grad = torch.ones_like(model.weight)
        out["verdict_finite"] = all_finite(par, finite_flag(torch.tensor(1.0, dtype=torch.float64)))
        model.weight.grad = torch.ones_like(model.weight)
        bad = torch.tensor(math.nan if rank == 1 else 1.0, dtype=torch.float64)
        out["verdict_one_nan"] = all_finite(par, finite_flag(bad))  # rank 0's own loss is finite

        # a run of 2 optimizer steps (mini = 2 rows per rank of 4): count the all-reduces
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        steps = OptimizerSteps(opt, sched, par, torch.device("cpu"), grad_clip=1e9, prefix="role")
        calls = []
        real = dist.all_reduce

        def counting(t, *a, **k):
            calls.append(t.numel())
            return real(t, *a, **k)
        dist.all_reduce = counting
        try:
            from baton import fields as F
            from baton.batch import Batch
            x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]], dtype=torch.float64)
            mask = torch.ones(4, 1)
            b = Batch({"x": x, F.RESPONSE_MASK: mask})

            def loss(mc, counts):
                return (model(mc["x"])[:, 0] ** 2).sum() / counts[0]
            metrics, n = steps.run(b, epochs=1, mini=2, micro=1, seed=0, version=0, shuffle=lambda bb, s: bb,
                                   prepare=lambda mb: steps.global_counts(mb[F.RESPONSE_MASK]), loss=loss)
        finally:
            dist.all_reduce = real
        out.update(n=n, calls=calls, skipped=metrics["role/nonfinite_skipped"])

        # overlapped buckets: 3 layers cut into several buckets, launched during the backward,
        # summing to what the one flat all-reduce gives
        import baton.models.parallel as parallel_mod
        parallel_mod.GRAD_BUCKET_BYTES = 200  # a bucket per layer or two
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 1)).double()
        npar = wrap(net, mesh, "ddp")
        x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))

        def backward(arm):
            net.zero_grad(set_to_none=True)
            y = net(x).sum()
            if arm:
                npar.arm_grad_sync(torch.zeros(1, dtype=torch.float64))
            y.backward()
            launched = len(npar._overlap.works) if arm else 0
            npar.sync_grads(extra=torch.zeros(1, dtype=torch.float64))
            return [q.grad.clone() for q in net.parameters()], launched
        flat, _ = backward(False)
        over, launched = backward(True)
        out.update(buckets=len(npar._overlap.buckets), launched=launched,
                   same=all(torch.equal(a, b) for a, b in zip(flat, over)))

        # two micro-batches (the sync armed before the second backward only) and a layer
        # that gets no gradient: the first micro-batch's gradients are carried into the
        # buckets, the unused layer keeps grad None, the rest are views of the buckets
        unused = nn.Linear(2, 2).double()
        net2 = nn.ModuleDict({"net": net, "unused": unused})
        par2 = wrap(net2, mesh, "ddp")

        def two_micro(arm):
            net2.zero_grad(set_to_none=True)
            net(x[:2]).sum().backward()
            if arm:
                par2.arm_grad_sync(torch.zeros(1, dtype=torch.float64))
            net(x[2:]).sum().backward()
            par2.sync_grads(extra=torch.zeros(1, dtype=torch.float64))
            return [q.grad.clone() for q in net.parameters()]
        flat2 = two_micro(False)
        over2 = two_micro(True)
        out.update(same_accumulated=all(torch.equal(a, b) for a, b in zip(flat2, over2)),
                   unused_none=all(q.grad is None for q in unused.parameters()),
                   views=all(q.grad._base is not None for q in net.parameters()))
        q.put((rank, out))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_fold_the_loss_verdict_and_the_normalisers():
    ctx = mp.get_context("fork")  # the ranks inherit the imports (spawn re-imports torch: ~10 s here)
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank in (0, 1):
        r = results[rank]
        assert r["grad"] == [[3.0, 3.0]]  # 1 + 2, summed
        assert r["extra"] == [30.0]  # 10 + 20, in the same all-reduce
        assert r["verdict_finite"] is True
        assert r["verdict_one_nan"] is False  # the same verdict on both ranks
        assert r["n"] == 2 and r["skipped"] == 0.0
        # 2 optimizer steps: one normalisers all-reduce ([2 mini-batches, 2] counts), one
        # gradient all-reduce per step (1 x 2 weights + the verdict), one loss all-reduce
        assert r["calls"] == [4, 3, 3, 1], r["calls"]
        assert r["buckets"] >= 3 and r["launched"] == r["buckets"]  # all in flight before sync_grads
        assert r["same"]  # bit for bit the flat all-reduce's sums
        assert r["same_accumulated"] and r["unused_none"] and r["views"]
