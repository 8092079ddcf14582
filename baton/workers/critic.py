"""The critic role: a value model V(prefix) for PPO with GAE.

Consumes rollout rows (prompt/response ids and masks); produces `values` [B, R] (zero on
response padding) and, given `returns` [B, R] and the rollout-time `values`, takes optimizer
steps on the clipped value loss (`baton.algos.value.critic_loss`):

    0.5 * max((V - G)^2, (clip(V, V_old - c, V_old + c) - G)^2)

The model is any local HF causal-LM directory loaded as a token classifier with one label:
the backbone plus a scalar `score` head (no bias, no dropout). From a causal-LM checkpoint
(e.g. the actor's) the head is new (seeded init, identical on every rank); from a reward-model
directory (`AutoModelForSequenceClassification`, `num_labels=1`, as `baton rm` writes) the
trained head loads as is, since both classes name it `score`.

Value of response token t = the head on the hidden state of the position that *predicts*
token t (the last prompt token for t = 0): the value of the prefix before the token, the
state in which the policy chose it, as in verl / OpenRLHF.

Data parallel like the actor: mini-/micro-batch sizes count rows across ranks, the loss is
normalised by global token / sequence counts (all-reduced first) and gradients are summed
with one flat all-reduce, so 1 rank x 8 rows = 8 micro-batches of 1 = 2 ranks x 4
(tests/workers/test_critic.py). Own optimizer and LR schedule (`baton.workers.optim`).
`critic.strategy` (ddp | fsdp2, tp from `placement.mesh`) places the model on the worker's
mesh as the actor's strategy does (`baton.models.parallel`); under fsdp2 the values come from
the model's own forward (no shared-prompt pass, which calls the backbone around the root).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import torch
import torch.distributed as dist

from baton import fields as F
from baton.algos import LOSS_AGG, critic_loss
from baton.algos.logprobs import upcast
from baton.batch import Batch
from baton.models.hf_cache import output_cache
from baton.controller import Dispatch, Worker, register
from baton.models.config import ModelConfig
from baton.models.load import load_tokenizer, save_pretrained
from baton.models.parallel import wrap
from baton.models.precision import autocast, master_dtype, resolve_bf16
from baton.workers.optim import OptimConfig
from baton.workers.optimizer_steps import OptimizerSteps
from baton.workers.sequences import _pieces_shared_prompt, model_inputs, prompt_groups

CRITIC_STATE = "critic_state.pt"


@dataclass
class CriticConfig(OptimConfig):
    """The recipe's `critic:` section (its presence turns the critic on): its optimizer
    (`OptimConfig`, the keys flat here) and its updates. Batch sizes count rows across all
    data-parallel ranks, as the actor's do."""
    lr: float = 1e-4
    path: str = ""  # a local HF dir (causal LM or reward model); "" = the actor's model.path
    pretrain_steps: int = 0  # trainer steps in which the critic trains alone (the actor waits)
    mini_batch_size: int = 0  # rows per optimizer step; 0 = the whole step's batch
    micro_batch_size: int = 32  # rows per forward/backward
    epochs: int = 1  # passes over each rollout batch
    value_clip: float | None = 0.2  # c in clip(V, V_old +- c); None = unclipped 0.5 (V - G)^2
    loss_agg: str = "token-mean"  # a name in baton.algos.LOSS_AGG
    bf16: bool | None = None  # as actor.bf16: None = on CUDA yes, on the CPU no
    strategy: Literal["ddp", "fsdp2"] = "ddp"  # how the model sits on the mesh (baton.models.parallel)
    offload: bool = False  # as actor.offload: optimizer state on the CPU between updates

    def check(self) -> None:
        self.check_optim("critic")
        if self.micro_batch_size < 1 or self.epochs < 1 or self.mini_batch_size < 0 or self.pretrain_steps < 0:
            raise ValueError("critic: micro_batch_size must be >= 1, epochs >= 1, mini_batch_size and pretrain_steps "
                             f">= 0 (got micro_batch_size={self.micro_batch_size}, epochs={self.epochs}, "
                             f"mini_batch_size={self.mini_batch_size}, pretrain_steps={self.pretrain_steps})")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ValueError(f"critic.value_clip must be > 0 or null, got {self.value_clip}")
        if self.loss_agg not in LOSS_AGG:
            raise ValueError(f"critic.loss_agg={self.loss_agg!r} is not one of {sorted(LOSS_AGG)}")


def load_value_model(path: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """Backbone + scalar `score` head (no bias, no dropout) from a local HF directory; a head
    the directory lacks is initialised from `seed` (so every rank builds the same one)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    if not Path(path).is_dir():
        raise FileNotFoundError(f"critic model directory not found: {path!r} (baton only loads local checkpoints)")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    config.num_labels, config.token_classification_bias, config.classifier_dropout = 1, False, 0.0
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=dtype,
                                                               local_files_only=True)


class _ScoreView:
    """The value model seen as `sequences._pieces_shared_prompt` expects a causal LM: called
    with ids / mask / positions / cache, returns `.logits` (here the head's [.., 1] values)
    and its KV cache, so the critic shares each prompt's forward across its group
    exactly as the actor does."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, **inputs: Any) -> SimpleNamespace:
        out = self.model.base_model(**inputs)
        return SimpleNamespace(logits=self.model.score(out.last_hidden_state), cache=output_cache(out),
                               forward=self.model.base_model.forward)


def prefix_values(model: torch.nn.Module, batch: Batch, share_prompts: bool = True) -> torch.Tensor:
    """V [B, R] of each response token's prefix (the hidden state that predicts the token),
    0 on response padding. Runs with the caller's grad mode. With `share_prompts`, rows that
    repeat the previous row's prompt reuse its forward pass (equal values, tested)."""
    device = next(model.parameters()).device
    first, run = prompt_groups(batch) if share_prompts else (None, None)
    P, R = batch[F.PROMPT_IDS].shape[1], batch[F.RESPONSE_IDS].shape[1]
    if first is not None and len(first) < len(batch):
        pieces = _pieces_shared_prompt(_ScoreView(model), batch, first, run, device)
    else:
        inputs = {k: v.to(device) for k, v in model_inputs(batch).items()}
        pieces = [(torch.arange(len(batch)), model(**inputs, use_cache=False).logits[:, P - 1:P + R - 1])]
    order, vals = [], []
    for rows, scores in pieces:  # scores [b, L, 1]
        vals.append(torch.nn.functional.pad(upcast(scores[..., 0]), (0, R - scores.shape[1])))  # [b, R]
        order.append(rows)
    values = torch.cat(vals)[torch.argsort(torch.cat(order)).to(device)]  # [B, R] batch order
    return torch.where(batch[F.RESPONSE_MASK].to(device).bool(), values, 0.0)


def group_shuffled(batch: Batch, seed: int) -> Batch:
    """Rows reordered by a seeded shuffle of whole prompt groups (a group's rows stay
    together, so a micro-batch shares each prompt's forward), as the actor shuffles."""
    first, run = prompt_groups(batch)  # [U], [B]
    perm = torch.randperm(len(first), generator=torch.Generator().manual_seed(seed))  # [U]
    rank = torch.empty_like(perm)
    rank[perm] = torch.arange(len(perm))
    return batch.rows(torch.argsort(rank[run], stable=True))


class CriticWorker(Worker):
    """`CriticWorker(critic, model, total_steps=, seed=, max_new_tokens=)`: its own section
    plus the model section (the default path and the dtype) and the run facts its loss and
    schedule depend on."""

    def __init__(self, critic: CriticConfig, model: ModelConfig, *, total_steps: int, seed: int,
                 max_new_tokens: int):
        super().__init__()
        self.cfg, self.seed, self.max_new_tokens = critic, seed, max_new_tokens
        self.path, self.dtype = critic.path or model.path, master_dtype(model.torch_dtype)  # fp32 master
        self.model = load_value_model(self.path, self.dtype, seed).to(self.device)
        self.tokenizer = load_tokenizer(self.path)
        if self.world_size > 1:  # belt and braces: every rank starts from rank 0's weights
            for p in self.model.parameters():
                dist.broadcast(p.data, src=0)
        c = critic
        self.bf16 = resolve_bf16(c.bf16, self.device, model.torch_dtype)
        # in place; before the optimizer sees it
        self.par = wrap(self.model, self.mesh, c.strategy, mixed_precision=self.bf16, cpu_offload=c.offload)
        # fsdp2: the shared-prompt pass calls the backbone and the head around the sharded root
        self.share_prompts = self.par.share_prompts and c.strategy != "fsdp2"
        self.optim, self.sched = c.build(self.model, total_steps)
        self.steps = OptimizerSteps(self.optim, self.sched, self.par, self.device, c.grad_clip,
                                    offload=c.offload, prefix="critic", loss_key="vf_loss")
        self.updates = 0

    # --- inference ---------------------------------------------------------------------
    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # returns a future
    def compute_values(self, batch: Batch) -> Batch:
        """Consumes prompt/response ids; produces values [B, R] (0 on padding)."""
        self.model.eval()
        out = []
        with torch.no_grad(), autocast(self.device, self.bf16):
            for micro in batch.minibatches(max(1, self.cfg.micro_batch_size), shuffle=False):
                out.append(prefix_values(self.model, micro, self.share_prompts))  # moved once, at the boundary
        return Batch({F.VALUES: torch.cat(out)})

    # --- training ----------------------------------------------------------------------
    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return self.par.all_reduce(t)  # SUM over the data ranks (tp peers share rows)

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # a future: runs beside the actor's update
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Consumes rows with `values` (the critic at rollout time) and `returns` (GAE
        targets); takes one optimizer step per mini-batch, `epochs` times; produces metrics.

        critic/vf_loss: the global loss summed over mini-batches / their count (as actor/loss);
        critic/vf_clipfrac, critic/value_mean: exact token fractions / means over every rank's
        tokens of every micro-batch; critic/grad_norm: mean over optimizer steps.
        """
        c = self.cfg
        pad = batch.padding_mask()  # [B] dispatch padding must not count
        mask_all = batch[F.RESPONSE_MASK].float() * ~pad[:, None]  # [B, R]
        batch = Batch(dict(batch.tensors), {}, {})
        batch[F.RESPONSE_MASK] = mask_all
        rows_global = len(batch) * self.dp_size
        tok = torch.zeros(3, dtype=torch.float64)  # [clipped, value sum, tokens], all-reduced at the end

        def prepare(mb: Batch) -> tuple[float, float]:
            return self.steps.global_counts(mb[F.RESPONSE_MASK])

        def loss(mc: Batch, counts: tuple[float, float]) -> torch.Tensor:
            nonlocal tok
            m = mc[F.RESPONSE_MASK]  # [b, R]
            with autocast(self.device, self.bf16):
                values = prefix_values(self.model, mc, self.share_prompts)  # [b, R]
            value, stats = critic_loss(
                values=values, old_values=mc[F.VALUES].to(values.device),
                returns=mc[F.RETURNS].to(values.device), response_mask=m.to(values.device),
                clip_range=c.value_clip, agg_mode=c.loss_agg, global_tokens=counts[0],
                global_seqs=counts[1], max_len=self.max_new_tokens)
            n_tok = float(m.sum())
            tok = tok + torch.tensor([float(stats.get("value_clip_frac", 0.0)) * n_tok,
                                      float(stats["value_mean"]) * n_tok, n_tok], dtype=torch.float64)
            return value

        self.model.train()
        metrics, _ = self.steps.run(
            batch, epochs=c.epochs, mini=max(1, (c.mini_batch_size or rows_global) // self.dp_size),
            micro=max(1, c.micro_batch_size // self.dp_size), seed=self.seed, version=self.updates,
            shuffle=group_shuffled, prepare=prepare, loss=loss)
        self.updates += 1
        tok = self._all_reduce(tok)
        n = max(tok[2].item(), 1.0)
        return {**metrics, "critic/vf_clipfrac": tok[0].item() / n, "critic/value_mean": tok[1].item() / n}

    # --- checkpoints -------------------------------------------------------------------
    @register(dispatch=Dispatch.ONE_TO_ALL_RANK0)  # every rank runs (sharded: gathers); rank 0 writes
    def save_checkpoint(self, path: str) -> str:
        """Write the value model (HF format, loadable by `load_value_model`) with its
        optimizer and schedule state, atomically, to `path` (sharded: every rank gathers,
        rank 0 writes)."""
        sharded = self.par.sharded
        full = dict(self.par.full_state_dict_iter(device="cpu")) if sharded else None
        optim_state = self.par.optim_state_dict(self.optim)  # sharded: a collective
        if self.rank != 0:
            return path
        state = {"optim": optim_state, "sched": self.sched.state_dict(), "updates": self.updates}
        return str(save_pretrained(self.model, self.tokenizer, path, state_dict=full,
                                   extra=lambda tmp: torch.save(state, tmp / CRITIC_STATE)))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore weights, optimizer, schedule and update count from `save_checkpoint`'s dir."""
        loaded = load_value_model(path, self.dtype, self.seed)
        self.par.load_full_state_dict(loaded.named_parameters())  # each rank keeps its shard
        state = torch.load(Path(path) / CRITIC_STATE, weights_only=False, map_location="cpu")  # a GPU run's too
        self.par.load_optim_state_dict(self.optim, state["optim"])
        self.sched.load_state_dict(state["sched"])
        self.updates = state["updates"]
