"""The actor role: the trainable policy.

Consumes rollout batches (prompt/response ids, masks, old logprobs, advantages, and
reference logprobs when KL is on); produces per-token logprobs and policy updates.
Data parallel: the losses are normalised by global token / sequence counts (all-reduced
over the data ranks first), so 2 ranks x 4 rows give the gradient of 1 rank x 8 rows (see
baton.algos.aggregate_loss). How the module sits on the worker's mesh is `actor.strategy`
(`baton.models.parallel`): `ddp` (a full replica per rank, gradients summed with one flat
all-reduce per optimizer step) or `fsdp2` (sharded parameters, gradients reduce-scattered
in backward), each with tensor parallelism when `placement.mesh.tp` > 1; this file only
calls the strategy (all-reduce over data ranks, grad sync, clip, full tensors for
checkpoints and the engine).

LoRA (`model.lora`, `baton.models.lora`): only the adapters train (the optimizer holds
only them); the reference policy is this same module with the adapters disabled
(`compute_ref_logprobs`, no second model); checkpoints hold the adapter in PEFT format
(the base stays at `model.path`; `baton export --merge` writes base + adapter).
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from baton import fields as F
from baton.algos import actor_loss
from baton.algos.distill import DISTILL_LOSSES
from baton.algos.off_policy import mismatch_kl_sums
from baton.algos.policy_loss import policy_loss_args
from baton.algos.config import AlgoConfig
from baton.batch import PAD_KEY, Batch
from baton.controller import Dispatch, Worker, register
from baton.models.config import ModelConfig
from baton.models.load import load_model, load_tokenizer, save_pretrained
from baton.models.moe import RouterWatch, check_routing, load_balancing_loss
from baton.models.lora import (adapter_config, adapter_tensors, apply_lora, load_adapter_into, read_adapter,
                               save_adapter)
from baton.models.parallel import wrap
from baton.models.precision import (autocast, compute_dtype, memory_metrics, memory_phase, resolve_bf16,
                                   weights_dtype)
from baton.runs.checkpoints import atomic_dir
from baton.workers.optim import OptimConfig
from baton.workers.optimizer_steps import OptimizerSteps
from baton.workers.policy import Policy
from baton.workers.sequences import batched_logprobs, prompt_groups, response_logprobs, response_topk

TRAINER_STATE = "trainer_state.pt"


@dataclass
class ActorConfig(OptimConfig):
    """The recipe's `actor:` section: its optimizer (`OptimConfig`, the keys flat here) and its
    updates. Batch sizes count rows across all data-parallel ranks."""
    mini_batch_size: int = 0  # rows per optimizer step; 0 = the whole step's batch
    micro_batch_size: int = 32  # rows per forward/backward (gradient accumulation)
    epochs: int = 1  # passes over each rollout batch
    # bf16 autocast for forward/backward, fp32 master weights (fsdp2 on CUDA: bf16 params in
    # compute); None: on CUDA yes, on the CPU no (baton.models.precision)
    bf16: bool | None = None
    strategy: Literal["ddp", "fsdp2"] = "ddp"  # how the module sits on the mesh (baton.models.parallel)
    activation_checkpointing: bool = False  # recompute each decoder layer in backward
    # between phases: move the optimizer state to the CPU after each update (back before the
    # next; the gradients are freed after every update, offload or not); fsdp2 on CUDA also
    # keeps parameters on the CPU (FSDP2's CPUOffloadPolicy). On a CPU-only machine: a no-op.
    offload: bool = False
    # > 0: adds coef x the routers' load-balancing loss (baton.models.moe) to the policy loss of a
    # mixture-of-experts model. Off: RL starts from a model whose routing pretraining already
    # balanced, and the term pulls the routing away from what the rollout engine sampled with.
    router_aux_loss_coef: float = 0.0

    def check(self) -> None:
        self.check_optim("actor")
        if self.micro_batch_size < 1 or self.epochs < 1 or self.mini_batch_size < 0:
            raise ValueError("actor: micro_batch_size must be >= 1, epochs >= 1, mini_batch_size >= 0 "
                             f"(got micro_batch_size={self.micro_batch_size}, "
                             f"epochs={self.epochs}, mini_batch_size={self.mini_batch_size})")
        if self.router_aux_loss_coef < 0:
            raise ValueError(f"actor.router_aux_loss_coef must be >= 0 (got {self.router_aux_loss_coef})")


class ActorWorker(Worker):
    """`ActorWorker(model, actor, algo, temperature=, max_new_tokens=, total_steps=, seed=)`:
    its own sections (model, actor, algo) plus the few run facts its loss depends on."""

    def __init__(self, model: ModelConfig, actor: ActorConfig, algo: AlgoConfig, *,
                 temperature: float, max_new_tokens: int, total_steps: int, seed: int):
        super().__init__()
        self.model_cfg, self.cfg, self.algo = model, actor, algo
        self.temperature, self.max_new_tokens, self.seed = temperature, max_new_tokens, seed
        a = actor
        self.bf16 = resolve_bf16(a.bf16, self.device, model.torch_dtype)  # actor.bf16 made concrete for this device
        self.model = load_model(model.path, dtype=self.weights_dtype(model, self.device, self.bf16), device=self.device)
        self.tokenizer = load_tokenizer(model.path)
        if model.lora is not None:
            if a.strategy != "ddp" or self.tp_size > 1:
                raise ValueError("model.lora trains with actor.strategy=ddp and no tensor parallelism "
                                 f"(got strategy={a.strategy}, tp={self.tp_size}): the adapters are small, "
                                 "every rank holds them whole")
            self.model = apply_lora(self.model, model.lora, seed=seed)
        # in place: self.model is the wrapped module (sharded parameters are DTensors)
        self.par = wrap(self.model, self.mesh, a.strategy, mixed_precision=self.bf16,
                        activation_checkpointing=a.activation_checkpointing, cpu_offload=a.offload)
        self.optim, self.sched = a.build(self.model, total_steps)
        # what a colocated engine reads: the module itself, or (sharded) gathered full tensors
        self.policy = Policy(self.model, self.tokenizer, in_place=not self.par.sharded,
                             full_weights=self.par.full_state_dict_iter, compute_dtype=compute_dtype(self.bf16))
        self.steps = OptimizerSteps(self.optim, self.sched, self.par, self.device, a.grad_clip,
                                    offload=a.offload, prefix="actor")

    @staticmethod
    def weights_dtype(model: ModelConfig, device: torch.device, bf16: bool) -> torch.dtype:
        """fp32 master weights for the trained parameters; with LoRA the base is frozen:
        `model.dtype`, bf16 on a GPU computing in bf16 (`baton.models.precision.weights_dtype`;
        the adapters are peft's fp32 either way)."""
        return weights_dtype(device.type, "frozen" if model.lora is not None else "trained", model.torch_dtype, bf16)

    @property
    def updates(self) -> int:  # trainer steps taken: the policy version
        return self.policy.version

    # --- inference ---------------------------------------------------------------------
    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # returns a future
    def compute_logprobs(self, batch: Batch) -> Batch:
        """Consumes prompt/response ids; produces old_logprobs [B, R] and entropy [B, R]."""
        if F.ROUTING in batch:  # routing replay: rows whose recorded experts do not fit are refused
            check_routing(batch[F.ROUTING], self.model)
        self.model.eval()
        with autocast(self.device, self.bf16):
            out = batched_logprobs(self.model, batch, self.cfg.micro_batch_size, self.temperature,
                                   with_entropy=True)
        return Batch({F.OLD_LOGPROBS: out["logprobs"], F.ENTROPY: out[F.ENTROPY]})

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # returns a future
    def compute_ref_logprobs(self, batch: Batch) -> Batch:
        """LoRA only: the reference policy's logprobs [B, R] (`ref_logprobs`) = this module
        with its adapters disabled (the frozen base), so no reference model is loaded."""
        if self.model_cfg.lora is None:
            raise RuntimeError("compute_ref_logprobs on the actor needs model.lora (the base is the reference); "
                               "without LoRA the reference role holds its own copy")
        self.model.eval()
        with self.model.disable_adapter(), autocast(self.device, self.bf16):
            out = batched_logprobs(self.model, batch, self.cfg.micro_batch_size, self.temperature)
        return Batch({F.REF_LOGPROBS: out["logprobs"]})

    # --- training ----------------------------------------------------------------------
    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """SUM over the data ranks (tp peers hold the same rows: not counted twice)."""
        return self.par.all_reduce(t)

    def _loss(self, micro: Batch, n_tokens: float, n_seqs: float, tally: dict | None = None
              ) -> tuple[torch.Tensor, dict[str, Any], torch.Tensor]:
        algo = self.algo
        distill = None
        watch = RouterWatch(self.model) if self.cfg.router_aux_loss_coef > 0 else contextlib.nullcontext()
        with autocast(self.device, self.bf16), watch:
            form = DISTILL_LOSSES[algo.distill_loss]
            if not form.sampled:  # GKD: the student's logprobs of the teacher's top-k tokens too
                out = response_topk(self.model, micro, self.temperature, ids=micro[F.TEACHER_TOPK_IDS],
                                    entropy_grad=algo.entropy_coef > 0, share_prompts=self.par.share_prompts)
                logp, ent = out["logprobs"], out[F.ENTROPY]
                distill = form.terms(out["topk_logprobs"], micro[F.TEACHER_TOPK_LOGPROBS], algo)  # [B, R]
            else:
                logp, ent = response_logprobs(self.model, micro, self.temperature,
                                              with_entropy=True, entropy_grad=algo.entropy_coef > 0,
                                              share_prompts=self.par.share_prompts, tally=tally)
        loss, stats = actor_loss(
            logprobs=logp, old_logprobs=micro[F.OLD_LOGPROBS], advantages=micro[F.ADVANTAGES],
            response_mask=micro[F.RESPONSE_MASK].float(),
            ref_logprobs=micro[F.REF_LOGPROBS] if algo.kl_coef > 0 else None, entropy=ent,
            policy_loss=algo.policy_loss,
            policy_loss_kwargs=policy_loss_args(algo.policy_loss, algo),  # as the loss declares
            kl_estimator=algo.kl_estimator, kl_coef=algo.kl_coef, entropy_coef=algo.entropy_coef,
            agg_mode=algo.loss_agg, global_tokens=n_tokens, global_seqs=n_seqs,
            max_len=self.max_new_tokens, distill=distill)
        if isinstance(watch, RouterWatch):  # mean per micro-batch: the caller weighs micro-batches by rows
            aux = load_balancing_loss(watch)
            stats["router_aux_loss"] = aux.detach()
            loss = loss + self.cfg.router_aux_loss_coef * aux * len(micro) / (n_seqs or len(micro))
        # metrics stay tensors (float64) until the update ends: no device sync per micro-batch
        return loss, {f"actor/{k}": v.detach().double() if torch.is_tensor(v) else float(v) for k, v in stats.items()}, logp

    @register(dispatch=Dispatch.DP_COMPUTE)
    def update(self, batch: Batch) -> dict[str, float]:
        """Consumes a rollout batch with advantages; produces metrics; takes optimizer steps
        (`baton.workers.optimizer_steps`: clipping, the non-finite skip, offload, schedule).

        Mini-batches and micro-batch sizes count rows across all ranks; each rank takes its
        share. Rows that are dispatch padding get a zero mask.

        `rollout/logprob_mismatch_kl` (engine vs trainer, with `rollout_logprobs` in the batch):
        from the first mini-batch's forward, which runs at the weights the rows are scored
        against (no optimizer step yet), so the metric costs no forward of its own. Likewise
        `rollout/routing_mismatch` with routing replay: the share of the replayed (token, MoE
        layer) decisions whose experts the trainer's own routing would have chosen otherwise.
        """
        a = self.cfg
        batch = self._mask_padding(batch)
        if F.ROUTING in batch:
            check_routing(batch[F.ROUTING], self.model)
        tally: dict = {}
        rows_global = len(batch) * self.dp_size
        sums: dict[str, float] = {}
        probe = torch.zeros(2, dtype=torch.float64, device=self.device)  # mismatch_kl_sums
        minis = itertools.count()  # the mini-batch's index in the update (all epochs)

        def prepare(mb: Batch) -> tuple[float, float, int, int]:
            return (*self.steps.global_counts(mb[F.RESPONSE_MASK]), len(mb), next(minis))

        def loss(mc: Batch, ctx: tuple[float, float, int, int]) -> torch.Tensor:
            value, stats, logp = self._loss(mc, ctx[0], ctx[1], tally if ctx[3] == 0 else None)
            for k, v in stats.items():  # metrics: mean over micro-batches, rows-weighted
                sums[k] = sums.get(k, 0.0) + v * len(mc) / ctx[2]
            if ctx[3] == 0 and F.ROLLOUT_LOGPROBS in mc:
                probe.add_(mismatch_kl_sums(logp.detach(), mc[F.ROLLOUT_LOGPROBS], mc[F.RESPONSE_MASK]))
            return value

        self.model.train()
        with memory_phase("update", self.device):  # CUDA: this phase's peak memory
            metrics, n_steps = self.steps.run(
                batch, epochs=a.epochs, mini=max(1, (a.mini_batch_size or rows_global) // self.dp_size),
                micro=max(1, a.micro_batch_size // self.dp_size), seed=self.seed, version=self.updates,
                shuffle=self._group_shuffled, prepare=prepare, loss=loss)
        self.policy.version += 1
        if F.ROLLOUT_LOGPROBS in batch:
            kl_sum, tokens = self._all_reduce(probe).tolist()
            metrics["rollout/logprob_mismatch_kl"] = kl_sum / tokens if tokens > 0 else 0.0
        if F.ROUTING in batch:
            counts = torch.stack([torch.as_tensor(tally.get(k, 0.0), dtype=torch.float64, device=self.device)
                                  for k in ("routing_differ", "routing_replayed")])
            differ, replayed = self._all_reduce(counts).tolist()
            metrics["rollout/routing_mismatch"] = differ / replayed if replayed > 0 else 0.0
        # CUDA: memory/peak_gib_<phase> of this process's phases since the last update (the
        # colocated rollout's included); nothing on the CPU
        return {**{k: float(v) / max(n_steps, 1) for k, v in sums.items()}, **metrics, **memory_metrics()}

    @staticmethod
    def _group_shuffled(batch: Batch, seed: int) -> Batch:
        """Shuffle whole prompt groups, keeping each group's rows together, so that a
        micro-batch holds whole groups and each prompt's forward pass is shared."""
        first, run = prompt_groups(batch)  # [U], [B]
        perm = torch.randperm(len(first), generator=torch.Generator().manual_seed(seed))  # [U]
        rank = torch.empty_like(perm)
        rank[perm] = torch.arange(len(perm))
        return batch.rows(torch.argsort(rank[run], stable=True))

    @staticmethod
    def _mask_padding(batch: Batch) -> Batch:
        """Dispatch padding rows (copies of real rows) must not count in the loss."""
        if not batch.meta.get(PAD_KEY, 0):  # no padding rows (read from meta: no device sync)
            return batch
        pad = batch.padding_mask()  # [B], on the batch's device
        batch = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
        mask = batch[F.RESPONSE_MASK]
        batch[F.RESPONSE_MASK] = mask * ~pad[:, None]
        return batch

    # --- checkpoints -------------------------------------------------------------------
    @register(dispatch=Dispatch.ONE_TO_ALL_RANK0)  # every rank gathers; rank 0 writes
    def save_checkpoint(self, path: str, driver_state: dict[str, Any]) -> str:
        """Write model + tokenizer (HF format) and optimizer/driver state to `path`, atomically
        and durably (a crash leaves the previous checkpoint or this one). Refuses non-finite
        weights: a checkpoint that `resume=auto` would load must be trainable.

        Sharded strategies: every rank takes part in gathering each full tensor in turn (to
        rank 0's CPU) and the full optimizer state; only rank 0 writes. LoRA: the adapter in
        PEFT format (adapter_config.json + adapter_model.safetensors) instead of the model."""
        if self.model_cfg.lora is not None:
            return self._save_lora_checkpoint(path, driver_state)
        weights = self.par.full_state_dict_iter(device="cpu" if self.par.sharded else None)
        if self.rank != 0:
            for _ in weights:  # the gathers are collectives: keep in step with rank 0
                pass
            self.par.optim_state_dict(self.optim)
            return path
        full = dict(weights)  # unsharded: the parameters themselves, no copy
        optim_state = self.par.optim_state_dict(self.optim)
        bad = [n for n, p in full.items() if not torch.isfinite(p).all()]
        if bad:
            raise FloatingPointError(f"not saving {path}: {len(bad)} parameter tensor(s) are not finite "
                                     f"(first: {bad[0]})")
        state = {"optim": optim_state, "sched": self.sched.state_dict(),
                 "updates": self.updates, "driver": driver_state}
        return str(save_pretrained(self.model, self.tokenizer, path,
                                   state_dict=full if self.par.sharded else None,
                                   extra=lambda tmp: torch.save(state, tmp / TRAINER_STATE)))

    def _save_lora_checkpoint(self, path: str, driver_state: dict[str, Any]) -> str:
        if self.rank != 0:
            return path
        adapter = dict(adapter_tensors(self.model))
        bad = [n for n, t in adapter.items() if not torch.isfinite(t).all()]
        if bad:
            raise FloatingPointError(f"not saving {path}: {len(bad)} adapter tensor(s) are not finite (first: {bad[0]})")
        state = {"optim": self.optim.state_dict(), "sched": self.sched.state_dict(),
                 "updates": self.updates, "driver": driver_state}
        with atomic_dir(Path(path).resolve()) as tmp:
            save_adapter(adapter, adapter_config(self.model, Path(self.model_cfg.path).resolve()), tmp)
            self.model.get_base_model().config.save_pretrained(str(tmp))  # the architecture, for tools
            self.tokenizer.save_pretrained(str(tmp))
            torch.save(state, tmp / TRAINER_STATE)
        return str(Path(path).resolve())

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore weights (LoRA: the adapter), optimizer and schedule; returns the driver's
        saved state."""
        if self.model_cfg.lora is not None:
            load_adapter_into(self.model, read_adapter(path)[1])
        else:
            loaded = load_model(path, dtype=self.weights_dtype(self.model_cfg, self.device, self.bf16),
                                device=self.device)
            # in place (each rank keeps its shard): the colocated engine keeps reading these tensors
            self.par.load_full_state_dict(loaded.named_parameters())
            del loaded
        state = torch.load(Path(path) / TRAINER_STATE, weights_only=False, map_location="cpu")  # a GPU run's too
        self.par.load_optim_state_dict(self.optim, state["optim"])
        self.sched.load_state_dict(state["sched"])
        self.policy.version = state["updates"]
        return state["driver"]
