"""The reference role: a frozen copy of the starting policy, for the KL term.

Consumes prompt/response ids; produces ref_logprobs [B, R]. Loaded only when
`algo.kl_coef > 0` (GRPO) or unless `dpo.reference_free` (DPO). Online DPO may refresh it
to the current policy every K steps (`load_weights`, iterative / SPIN-style).
"""

from __future__ import annotations

from typing import Any

import torch

from baton import fields as F
from baton.batch import Batch
from baton.controller import Dispatch, Execute, Worker, register
from baton.models.config import ModelConfig
from baton.models.load import load_model
from baton.workers.sequences import batched_logprobs


class ReferenceWorker(Worker):
    """`ReferenceWorker(model, temperature=, micro_batch_size=)`: the starting weights, frozen;
    logprobs at the rollout temperature, as the actor computes its own."""

    def __init__(self, model: ModelConfig, *, temperature: float, micro_batch_size: int):
        super().__init__()
        self.temperature, self.micro_batch_size = temperature, micro_batch_size
        self.model = load_model(model.path, dtype=model.torch_dtype, device=self.device)
        self.model.eval().requires_grad_(False)

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # returns a future
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        out = batched_logprobs(self.model, batch, self.micro_batch_size, self.temperature)
        return Batch({F.REF_LOGPROBS: out["logprobs"]})

    # --- refresh (online DPO's dpo.ref_refresh_every) ------------------------------------
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_weights(self, state: dict[str, Any]) -> None:
        """Replace the frozen weights with `state` (full tensors by parameter name, e.g. the
        actor's `get_weights()`); they stay frozen until the next call."""
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(state[name])

    @register(dispatch=Dispatch.ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def get_weights(self) -> dict[str, Any]:
        """A CPU copy of the reference's parameters by name (saved with a checkpoint once
        refreshed)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.named_parameters()}
