"""The reference role: a frozen copy of the starting policy, for the KL term.

Consumes prompt/response ids; produces ref_logprobs [B, R]. Loaded only when
`algo.kl_coef > 0` (GRPO) or unless `dpo.reference_free` (DPO). Online DPO may refresh it
to the current policy every K steps (`load_weights`, iterative / SPIN-style).
The teacher of on-policy distillation (`baton.workers.teacher`) is this worker on another
model: `frozen_logprobs` is the one computation both run.
"""

from __future__ import annotations

from typing import Any


from baton import fields as F
from baton.batch import Batch
from baton.controller import Dispatch, Worker, register
from baton.models.config import ModelConfig
from baton.models.load import load_model
from baton.models.parallel import wrap
from baton.models.precision import autocast, resolve_bf16, weights_dtype
from baton.workers.sequences import batched_logprobs


class ReferenceWorker(Worker):
    """`ReferenceWorker(model, temperature=, micro_batch_size=, strategy=)`: the starting
    weights, frozen; logprobs at the rollout temperature, as the actor computes its own.
    `strategy` (the actor's: `baton.models.parallel`) shards the frozen copy on the worker's
    mesh the way the actor is sharded (fsdp2, tp from `placement.mesh`). `bf16`: the actor's
    `actor.bf16` (None: on CUDA yes, on the CPU no), so that both take logprobs in the same
    precision."""

    def __init__(self, model: ModelConfig, *, temperature: float, micro_batch_size: int,
                 strategy: str = "ddp", bf16: bool | None = None):
        super().__init__()
        self.temperature, self.micro_batch_size = temperature, micro_batch_size
        self.bf16 = resolve_bf16(bf16, self.device)
        # frozen: bf16 weights on a GPU computing in bf16, model.dtype elsewhere
        dtype = weights_dtype(self.device.type, "frozen", model.torch_dtype, self.bf16)
        self.model = self.fit(load_model(model.path, dtype=dtype, device=self.device))
        self.model.eval().requires_grad_(False)
        self.par = wrap(self.model, self.mesh, strategy)

    def fit(self, model: Any) -> Any:
        """The loaded model as this role uses it (the teacher drops padded vocabulary rows)."""
        return model

    def frozen_logprobs(self, batch: Batch) -> Any:
        """[B, R] logprobs of the rows' response tokens under the frozen model (fp32: logits
        are upcast before the softmax), at the rollout temperature."""
        with autocast(self.device, self.bf16):
            return batched_logprobs(self.model, batch, self.micro_batch_size, self.temperature)["logprobs"]

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # returns a future
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        return Batch({F.REF_LOGPROBS: self.frozen_logprobs(batch)})

    # --- refresh (online DPO's dpo.ref_refresh_every) ------------------------------------
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_weights(self, state: dict[str, Any]) -> None:
        """Replace the frozen weights with `state` (full tensors by parameter name, e.g. the
        actor's `get_weights()`); they stay frozen until the next call."""
        missing = [n for n, _ in self.model.named_parameters() if n not in state]
        if missing:
            raise KeyError(f"load_weights: no tensor for {missing[0]!r} ({len(missing)} missing)")
        self.par.load_full_state_dict(state.items())  # each rank keeps its shard

    @register(dispatch=Dispatch.ONE_TO_ALL_RANK0)  # sharded: every rank takes part in the gathers
    def get_weights(self) -> dict[str, Any]:
        """A CPU copy of the reference's parameters by name (saved with a checkpoint once
        refreshed); rank 0's is the answer."""
        if not self.par.sharded:
            if self.rank != 0:
                return {}
            return {k: v.detach().to("cpu", copy=True) for k, v in self.model.named_parameters()}
        full = {k: v.to("cpu", copy=True) for k, v in self.par.full_state_dict_iter()}  # 1 rank: no alias
        return full if self.rank == 0 else {}
