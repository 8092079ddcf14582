"""One Tinker training client's model: the base model with LoRA adapters, AdamW, and the calls
the SDK's `TrainingClient` makes (forward, forward_backward, optim_step, state save / load,
adapter snapshots for sampling).

Runs on the server's one worker thread (`baton.tinker.service`): calls of a model execute in
the order they arrived, as the SDK's request ids ("turns") order them. The data of a request
run in right-padded micro-batches (`micro_batches`: consecutive data within
`TOKENS_PER_BATCH` padded tokens; each datum's logprobs and loss read its own positions only,
which attend to no padding); gradients add up over the data of every `forward_backward`
until `optim_step` applies and clears them.

LoRA (`create_lora_training_client(base_model, rank, train_attn, train_mlp, train_unembed)`):
baton's `apply_lora` with alpha `LORA_ALPHA` on the attention projections, the MLP projections
and `lm_head` as asked; the adapters are seeded with the request's seed (0 when none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from baton.algos.logprobs import logprobs_from_logits
from baton.models.load import load_model
from baton.models.lora import (LoraAdapterConfig, adapter_config, adapter_tensors, apply_lora, load_adapter_into,
                               read_adapter, save_adapter)
from baton.tinker.losses import LOSSES, loss_config
from baton.tinker.wire import Datum

LORA_ALPHA = 32.0
TOKENS_PER_BATCH = 2048  # padded tokens a forward pass holds (its logits: this x vocab floats, 400 MB at 49k)
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
OPTIMIZER_FILE = "optimizer.pt"


def lora_targets(train_attn: bool, train_mlp: bool, train_unembed: bool) -> list[str]:
    targets = (ATTN if train_attn else []) + (MLP if train_mlp else []) + (["lm_head"] if train_unembed else [])
    if not targets:
        raise ValueError("lora_config: at least one of train_attn, train_mlp, train_unembed must be true")
    return targets


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive indices of `lengths`, cut so that each batch's padded size (its count x
    its longest) stays within `budget` tokens; a datum longer than the budget is a batch of
    its own. In order: the data's sums and outputs keep the request's order."""
    out: list[list[int]] = []
    width = 0
    for i, n in enumerate(lengths):
        if out and (len(out[-1]) + 1) * max(width, n) <= budget:
            out[-1].append(i)
            width = max(width, n)
        else:
            out.append([i])
            width = n
    return out


class Trainee:
    """A LoRA policy under training, for one model id."""

    def __init__(self, model_id: str, base_path: str, rank: int, targets: list[str], seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.model_id, self.base_path, self.rank, self.targets = model_id, base_path, rank, targets
        self.lora = LoraAdapterConfig(rank=rank, alpha=LORA_ALPHA, target_modules=targets)
        self.model = apply_lora(load_model(base_path, dtype=dtype, device=device), self.lora, seed=seed)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        self.steps = 0
        self.vocab = self.model.config.vocab_size
        self.tokens_per_batch = TOKENS_PER_BATCH

    @property
    def device(self) -> torch.device:
        return self.params[0].device

    # --- forward / backward -------------------------------------------------------------
    def check(self, data: list[Datum], loss_fn: str, config: dict[str, Any]) -> dict[str, float]:
        """The loss config; ValueError naming what is wrong with the request (before any work)."""
        if loss_fn not in LOSSES:
            raise ValueError(f"loss_fn {loss_fn!r} is not served by baton tinker (served: {', '.join(LOSSES)}; "
                             "custom losses run client-side with forward_backward_custom)")
        cfg = loss_config(loss_fn, config)
        needed = ("target_tokens", *LOSSES[loss_fn].inputs)
        for i, d in enumerate(data):
            if not d.tokens:
                raise ValueError(f"data[{i}].model_input is empty")
            missing = [k for k in needed if k not in d.inputs]
            extra = sorted(set(d.inputs) - set(needed))
            if missing or extra:
                raise ValueError(f"data[{i}].loss_fn_inputs: loss_fn {loss_fn!r} takes {', '.join(needed)}"
                                 + (f"; missing {', '.join(missing)}" if missing else "")
                                 + (f"; not read: {', '.join(extra)}" if extra else ""))
            for k, v in d.inputs.items():
                if v.ndim != 1 or v.shape[0] != len(d.tokens):
                    raise ValueError(f"data[{i}].loss_fn_inputs[{k!r}] has shape {list(v.shape)}; it needs "
                                     f"[{len(d.tokens)}] (one value per model_input token)")
            targets = d.inputs["target_tokens"]
            if targets.dtype.kind not in "iu" or (targets < 0).any() or (targets >= self.vocab).any():
                raise ValueError(f"data[{i}].loss_fn_inputs['target_tokens'] must be token ids in [0, {self.vocab})")
            if max(d.tokens) >= self.vocab or min(d.tokens) < 0:
                raise ValueError(f"data[{i}].model_input holds a token id outside [0, {self.vocab})")
        return cfg

    def forward_backward(self, data: list[Datum], loss_fn: str, cfg: dict[str, float],
                         forward_only: bool) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum: its target logprobs and per-token loss; metrics: `loss:sum` (Tinker's
        losses are sums). Without `forward_only` the loss's gradient is accumulated. The data
        run in padded micro-batches of consecutive data (`micro_batches`); each datum's loss is
        computed on its own positions only, so padding adds nothing."""
        fn = LOSSES[loss_fn].fn
        outputs, total = [], 0.0
        for chunk in micro_batches([len(d.tokens) for d in data], self.tokens_per_batch):
            batch = [data[i] for i in chunk]
            width = max(len(d.tokens) for d in batch)
            tokens = torch.zeros(len(batch), width, dtype=torch.long, device=self.device)  # [B, T]
            targets = torch.zeros_like(tokens)  # [B, T]
            mask = torch.zeros_like(tokens)  # [B, T] 1 on each datum's own positions
            for row, d in enumerate(batch):
                tokens[row, :len(d.tokens)] = torch.tensor(d.tokens)
                targets[row, :len(d.tokens)] = torch.as_tensor(d.inputs["target_tokens"]).long()
                mask[row, :len(d.tokens)] = 1
            with torch.set_grad_enabled(not forward_only):
                logits = self.model(input_ids=tokens, attention_mask=mask).logits  # [B, T, V]
                logprobs = logprobs_from_logits(logits, targets)  # [B, T]
                per_token = [fn(logprobs[row, :len(d.tokens)],
                                {k: torch.tensor(v, device=self.device).float() for k, v in d.inputs.items()
                                 if k != "target_tokens"}, cfg) for row, d in enumerate(batch)]  # each [T_i]
                losses = torch.stack([t.sum() for t in per_token])  # [B]
            if not forward_only:
                losses.sum().backward()
            total += float(losses.detach().double().sum())
            outputs += [{"logprobs": logprobs[row, :len(d.tokens)].detach().cpu().float().numpy(),
                         "elementwise_loss": t.detach().cpu().float().numpy()}
                        for row, (d, t) in enumerate(zip(batch, per_token))]
        return outputs, {"loss:sum": total}

    def optim_step(self, adam: dict[str, float]) -> dict[str, float]:
        """AdamW with the request's parameters on the accumulated gradients, which are then
        cleared. Metrics: the gradient norm before clipping, the learning rate."""
        for group in self.optimizer.param_groups:
            group.update(lr=adam["learning_rate"], betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"],
                         weight_decay=adam["weight_decay"])
        clip = adam["grad_clip_norm"] if adam["grad_clip_norm"] > 0 else float("inf")
        grads = [p for p in self.params if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(grads, clip)) if grads else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"optim/grad_norm": norm, "optim/learning_rate": adam["learning_rate"]}

    # --- adapters and state -------------------------------------------------------------
    def snapshot(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """(PEFT adapter config, a copy of every adapter tensor): what a sampler serves."""
        return adapter_config(self.model, self.base_path), {k: v.clone() for k, v in adapter_tensors(self.model)}

    def save(self, directory: Path, optimizer: bool) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        config, tensors = self.snapshot()
        save_adapter(tensors, config, directory)
        if optimizer:
            torch.save(self.optimizer.state_dict(), directory / OPTIMIZER_FILE)

    def load(self, directory: Path, optimizer: bool) -> None:
        config, tensors = read_adapter(directory)
        if int(config.get("r", -1)) != self.rank:
            raise ValueError(f"checkpoint has LoRA rank {config.get('r')}; this model has rank {self.rank}")
        load_adapter_into(self.model, tensors)
        if optimizer:
            if not (directory / OPTIMIZER_FILE).is_file():
                raise ValueError("checkpoint holds no optimizer state (saved by save_weights_for_sampler?)")
            self.optimizer.load_state_dict(torch.load(directory / OPTIMIZER_FILE, weights_only=True))
        else:
            self.optimizer.state.clear()
