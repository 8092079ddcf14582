"""Worker classes and helpers for the strategy tests (importable by Ray workers by name)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from baton import fields as F
from baton.batch import Batch
from baton.controller import Dispatch, register
from baton.workers.actor import ActorWorker


class ProbeActor(ActorWorker):
    """The actor plus a view of the gradients of its last optimizer step (full tensors,
    gathered on every rank), recorded as the step takes them: the update frees them after."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last_grads: dict[str, torch.Tensor] = {}
        self.optim.register_step_pre_hook(lambda *_: self._record_grads())

    def _record_grads(self) -> None:
        self._last_grads = {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().cpu().clone()
                            for name, p in self.model.named_parameters() if p.grad is not None}

    @register(dispatch=Dispatch.ONE_TO_ALL_RANK0)
    def full_grads(self) -> dict[str, torch.Tensor]:
        return dict(self._last_grads)

    @register(dispatch=Dispatch.ONE_TO_ALL_RANK0)
    def full_weights(self) -> dict[str, torch.Tensor]:
        return {n: t.cpu().clone() for n, t in self.par.full_state_dict_iter()}


def rollout_batch(rows=8, P=5, R=6, vocab=50, seed=0) -> Batch:
    """Rows of 4 prompt groups x 2 samples with ragged responses (normalisers matter)."""
    g = torch.Generator().manual_seed(seed)
    resp_mask = torch.ones(rows, R, dtype=torch.long)
    for i in range(rows):
        resp_mask[i, 1 + i % R:] = 0
    prompt_mask = torch.ones(rows, P, dtype=torch.long)
    prompt_mask[::4, :2] = 0
    prompt_mask[1::4, :2] = 0
    prompt_ids = torch.randint(4, vocab, (rows // 2, P), generator=g).repeat_interleave(2, 0)
    logp = -torch.rand(rows, R, generator=g)
    return Batch({F.PROMPT_IDS: prompt_ids, F.PROMPT_MASK: prompt_mask,
                  F.RESPONSE_IDS: torch.randint(4, vocab, (rows, R), generator=g), F.RESPONSE_MASK: resp_mask,
                  F.OLD_LOGPROBS: logp, F.ADVANTAGES: torch.randn(rows, 1, generator=g).expand(rows, R).clone()})


class BroadcastingActor(ProbeActor):
    """The actor plus a broadcast of its (sharded) parameters into a server (rank 0 sends,
    the others take part in the per-bucket gathers)."""

    @register(dispatch=Dispatch.ONE_TO_ALL_RANK0)
    def broadcast_to(self, url: str, version: int, bucket_mb: float) -> None:
        from baton.rollout.remote import RemoteEngine
        from baton.sync import BroadcastSync

        named = list(self.model.named_parameters())  # DTensors: gathered bucket by bucket
        if self.rank != 0:
            BroadcastSync.participate(named, bucket_mb=bucket_mb)
            return
        sync = BroadcastSync([RemoteEngine(url)], bucket_mb=bucket_mb)
        try:
            sync.push(named, version)
        finally:
            sync.close()
