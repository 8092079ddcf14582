"""Reduce a per-token loss [B, R] to the scalar that is back-propagated, chosen by name
from `LOSS_AGG`, so that the gradient does not depend on how the batch was split.

Modes (sums are over masked tokens only):
  token-mean               sum_{b,t} loss / N_tokens                  (DAPO; every token weighs the same)
  seq-mean-token-mean      sum_b (mean_t loss_b) / N_seqs             (original GRPO)
  seq-mean-token-sum       sum_b (sum_t loss_b) / N_seqs              (verl; long sequences weigh more)
  seq-mean-token-sum-norm  sum_b (sum_t loss_b / max_len) / N_seqs    (Dr. GRPO; max_len a constant)

How the trainer must pass the normalisers. One optimizer step consumes a mini-batch that
is split over DP ranks and, on each rank, over micro-batches. Then:
  1. before the first micro-batch, compute `loss_normalisers(mask)` on the rank's whole
     mini-batch and all-reduce SUM it across DP ranks: global_tokens = real tokens in the
     mini-batch on all ranks, global_seqs = real (non-empty) sequences on all ranks;
  2. call `aggregate_loss(..., global_tokens=, global_seqs=, max_len=)` on each micro-batch
     and `backward()` it as is: no division by the number of micro-batches (gradient
     accumulation then sums to the full-batch gradient);
  3. combine the ranks' gradients with an all-reduce SUM. A DP wrapper that *averages*
     gradients (DDP / FSDP default) needs the loss multiplied by the DP world size.
  `max_len` must be the same constant everywhere (the generation max_tokens), never the
  padded width of a micro-batch, which changes with how rows were packed.
Left as None, the normalisers default to this call's own tensor (correct only when it
holds the whole mini-batch); seq-mean-token-sum-norm requires max_len explicitly.
Departure from verl: verl defaults Dr. GRPO's constant to the local padded width.
"""

from __future__ import annotations

import torch

from baton.algos.masked import masked_sum
from baton.algos.registry import Registry

LOSS_AGG = Registry("loss aggregation")
register_loss_agg = LOSS_AGG.register

Number = int | float | torch.Tensor


def loss_normalisers(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(real tokens, non-empty sequences) of a mask [B, R]; empty rows are batch padding."""
    per_seq = response_mask.sum(-1)  # [B]
    return per_seq.sum(), (per_seq > 0).sum()


@register_loss_agg("token-mean")
def _token_mean(loss, mask, *, global_tokens, global_seqs, max_len):
    if global_tokens is None:
        global_tokens = loss_normalisers(mask)[0]
    return masked_sum(loss, mask) / global_tokens


@register_loss_agg("seq-mean-token-mean")
def _seq_mean_token_mean(loss, mask, *, global_tokens, global_seqs, max_len):
    if global_seqs is None:
        global_seqs = loss_normalisers(mask)[1]
    lengths = mask.sum(-1).clamp(min=1)  # [B]; an empty row sums to 0 anyway
    per_seq = masked_sum(loss, mask, dim=-1) / lengths  # [B]
    return per_seq.sum() / global_seqs


@register_loss_agg("seq-mean-token-sum")
def _seq_mean_token_sum(loss, mask, *, global_tokens, global_seqs, max_len):
    if global_seqs is None:
        global_seqs = loss_normalisers(mask)[1]
    return masked_sum(loss, mask) / global_seqs


@register_loss_agg("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss, mask, *, global_tokens, global_seqs, max_len):
    if max_len is None:
        raise ValueError("seq-mean-token-sum-norm needs max_len (the generation max_tokens)")
    if global_seqs is None:
        global_seqs = loss_normalisers(mask)[1]
    return masked_sum(loss, mask) / max_len / global_seqs


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                   global_tokens: Number | None = None, global_seqs: Number | None = None,
                   max_len: int | None = None) -> torch.Tensor:
    """Scalar loss from per_token [B, R] and mask [B, R] by `mode` (see the module docstring)."""
    return LOSS_AGG[mode](per_token, mask, global_tokens=global_tokens,
                          global_seqs=global_seqs, max_len=max_len)
