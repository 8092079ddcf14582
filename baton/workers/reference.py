"""The reference role: a frozen copy of the starting policy, for the KL term.

Consumes prompt/response ids; produces ref_logprobs [B, R]. Loaded only when
`algo.kl_coef > 0`.
"""

from __future__ import annotations

from baton import fields as F
from baton.batch import Batch
from baton.controller import Dispatch, Worker, register
from baton.models.load import load_model
from baton.trainers.grpo_config import GRPOConfig
from baton.workers.actor import _dtype
from baton.workers.sequences import batched_logprobs


class ReferenceWorker(Worker):
    def __init__(self, cfg: GRPOConfig):
        super().__init__()
        self.cfg = cfg
        self.model = load_model(cfg.model.path, dtype=_dtype(cfg.model.dtype), device=self.device)
        self.model.eval().requires_grad_(False)

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # returns a future
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        out = batched_logprobs(self.model, batch, self.cfg.actor.micro_batch_size,
                               self.cfg.rollout.temperature)
        return Batch({F.REF_LOGPROBS: out["logprobs"]})
