"""Turn rollouts into model inputs and model outputs into per-response-token logprobs.

Shared by the actor (current and old logprobs) and the reference (frozen logprobs), so both
see exactly the same inputs as the rollout engine: prompts left-padded, responses
right-padded, position ids from the attention mask (`baton.padding`, the engine's convention).

Full logits are never built when the model's logits are exactly `lm_head(hidden)` (the
families in FUSED_HEAD_TYPES, an unsharded bias-free linear head, LoRA or not on the
backbone): the backbone's final hidden states go to `baton.algos.linear_logprobs`, which
works through the vocabulary in chunks of tokens in forward and backward. Other models
(sharded heads, softcapped logits, unknown families) take the plain path through logits.
"""

from __future__ import annotations

import torch

from baton.models.moe import replay_routing, routing_at_positions
from baton import fields as F
from types import SimpleNamespace
from typing import Any

from baton.algos import entropy_from_logits, logprobs_from_logits
from baton.algos.linear_logprobs import linear_logprobs
from baton.algos.logprobs import upcast
from baton.batch import Batch
from baton.models.hf_cache import cache_kwarg, output_cache
from baton.padding import position_ids


def response_attention(batch: Batch) -> torch.Tensor:
    """[B, R] 1 on every response token up to the row's last loss token: the loss mask with
    its holes filled. A multi-turn row's observation tokens (loss mask 0) are context the
    policy saw, so they are attended to; for a single-turn row this is the loss mask."""
    mask = batch[F.RESPONSE_MASK].long()
    return mask.flip(1).cummax(1).values.flip(1)


def model_inputs(batch: Batch) -> dict[str, torch.Tensor]:
    prompt_ids, response_ids = batch[F.PROMPT_IDS], batch[F.RESPONSE_IDS]  # [B, P], [B, R]
    mask = torch.cat([batch[F.PROMPT_MASK].long(), response_attention(batch)], dim=1)  # [B, T]
    return {"input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": mask, "position_ids": position_ids(mask)}  # [B, T] each


def prompt_groups(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of consecutive rows with the same prompt: (first row of each run [U], run of each
    row [B]), on the CPU wherever the batch is (row bookkeeping: they index batches and sort)."""
    ids, mask = batch[F.PROMPT_IDS], batch[F.PROMPT_MASK]  # [B, P]
    starts = torch.ones(len(ids), dtype=torch.bool)
    starts[1:] = ((ids[1:] != ids[:-1]).any(1) | (mask[1:] != mask[:-1]).any(1)).cpu()
    return starts.nonzero().flatten(), starts.cumsum(0) - 1


# model_type of the HF families whose causal-LM logits are lm_head(final hidden state), no
# scaling or softcapping after it: their logprobs can skip the full logits.
FUSED_HEAD_TYPES = ("qwen2", "qwen3", "llama", "mistral")


def fused_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """(backbone, output weight [V, H]) when `model`'s logits are exactly backbone hidden
    states @ weight.T, else None. A PEFT model's backbone carries its adapters (and their
    `disable_adapter()`); a sharded (DTensor) head, a LoRA-wrapped or biased head, or a
    family outside FUSED_HEAD_TYPES gives None."""
    from torch.distributed.tensor import DTensor

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in FUSED_HEAD_TYPES:
        return None
    head = base.get_output_embeddings()
    backbone = getattr(base, base.base_model_prefix, None)
    if type(head) is not torch.nn.Linear or head.bias is not None or backbone is None:
        return None
    if isinstance(head.weight, DTensor):  # fsdp2 / tp: the root's hooks must run; plain path
        return None
    return backbone, head.weight


class _HiddenView:
    """The backbone seen as `_pieces_shared_prompt` expects a causal LM: `.logits` are here
    the final hidden states [.., H] (the head is applied later, in chunks)."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        self.backbone = backbone

    def __call__(self, **inputs: Any) -> SimpleNamespace:
        out = self.backbone(**inputs)
        return SimpleNamespace(logits=out.last_hidden_state, cache=output_cache(out), forward=self.backbone.forward)


def _logits_full(model: Any, batch: Batch, device: torch.device, replay: tuple | None = None) -> torch.Tensor:
    """The outputs [B, R, X] at the positions that predict each response token (logits, or
    hidden states through a `_HiddenView`). replay: (the MoE model, a tally or None): those
    positions routed by the row's recorded experts (`routing`, baton.models.moe)."""
    inputs = {k: v.to(device) for k, v in model_inputs(batch).items()}
    P, R = batch[F.PROMPT_IDS].shape[1], batch[F.RESPONSE_IDS].shape[1]
    if replay is None:
        return model(**inputs, use_cache=False).logits[:, P - 1:P + R - 1]  # [B, R, X]
    with replay_routing(replay[0], routing_at_positions(batch[F.ROUTING], P), tally=replay[1]):
        return model(**inputs, use_cache=False).logits[:, P - 1:P + R - 1]


# What one extra forward/backward call costs, in padded tokens (measured on CPU for tiny
# models: ~5 ms of per-call overhead against ~10 tokens/ms of compute).
CALL_COST_TOKENS = 64


def length_buckets(lengths: torch.Tensor, call_cost: int | None = None) -> list[torch.Tensor]:
    """Split rows into buckets of similar response length, minimising padded tokens plus
    `call_cost` per bucket. lengths [B] -> list of row-index tensors (shortest first).

    Exact over the distinct lengths (dynamic programming, O(k^2) for k distinct lengths).
    Works on the CPU (row indices out; `lengths` on a GPU would cost a sync per count read).
    """
    lengths = lengths.cpu()
    call_cost = CALL_COST_TOKENS if call_cost is None else call_cost
    values, counts = torch.unique(lengths.clamp(min=1), return_counts=True)  # sorted ascending
    k = len(values)
    best = [0.0] + [float("inf")] * k  # best[j]: cost of the first j distinct lengths
    cut = [0] * (k + 1)
    for j in range(1, k + 1):
        rows = 0
        for i in range(j, 0, -1):  # bucket = distinct lengths i..j, padded to values[j-1]
            rows += int(counts[i - 1])
            cost = best[i - 1] + rows * int(values[j - 1]) + call_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    bounds, j = [], k
    while j > 0:
        bounds.append((int(values[cut[j]]), int(values[j - 1])))
        j = cut[j]
    clamped = lengths.clamp(min=1)
    return [((clamped >= lo) & (clamped <= hi)).nonzero().flatten() for lo, hi in reversed(bounds)]


def _pieces_shared_prompt(model: torch.nn.Module, batch: Batch, first: torch.Tensor,
                          run: torch.Tensor, device: torch.device):
    """Logits of the response tokens computing each distinct prompt once, yielded as
    (rows [b], logits [b, L, V]) per response-length bucket (L = the bucket's longest);
    whatever `model(...).logits` is: hidden states through a `_HiddenView`, values through
    the critic's view.

    GRPO rows come in groups of n samples of one prompt: the prompt's forward (and its
    backward) runs once per group; its KV cache is then gathered to every row and the
    responses attend to it, in buckets of similar length so that short responses are not
    padded to the longest one. Gradients flow through the gathered cache into the prompt.
    """
    from transformers import DynamicCache

    p_mask = batch[F.PROMPT_MASK][first].to(device)  # [U, P]
    p_pos = position_ids(p_mask)  # [U, P]
    out = model(input_ids=batch[F.PROMPT_IDS][first].to(device), attention_mask=p_mask,
                position_ids=p_pos, use_cache=True)
    layers = [(layer.keys, layer.values) for layer in output_cache(out).layers]  # [U, H, P, D] each
    cache_arg = cache_kwarg(getattr(out, "forward", None) or model.forward)
    first_logits = out.logits[:, -1]  # [U, V]: the last prompt position predicts token 0
    p_len = p_mask.sum(-1)  # [U]
    run = run.to(device)
    attn = response_attention(batch)  # [B, R]
    lengths = attn.sum(1).cpu()  # [B] bookkeeping, on the CPU
    for rows in length_buckets(lengths):
        L = max(1, int(lengths[rows].max()))
        src = run[rows.to(device)]  # [b] prompt of each row
        cache = DynamicCache()
        for i, (k, v) in enumerate(layers):
            cache.update(k[src], v[src], i)
        mask = torch.cat([batch[F.PROMPT_MASK][rows].long(), attn[rows, :L]], 1)  # [b, P+L]
        r_pos = p_len[src, None] + torch.arange(L, device=device)  # [b, L] continues the prompt
        r_logits = model(input_ids=batch[F.RESPONSE_IDS][rows, :L].to(device),
                         attention_mask=mask.long().to(device), position_ids=r_pos,
                         use_cache=True, **{cache_arg: cache}).logits  # [b, L, V]
        yield rows, torch.cat([first_logits[src][:, None], r_logits[:, :-1]], dim=1)  # [b, L, V]


def _response_pieces(model: torch.nn.Module, batch: Batch, share_prompts: bool, fused: bool,
                     tally: dict | None = None):
    """(device, fused head or None, pieces): `pieces` yields (rows [b], states [b, L, X]) per
    bucket, states being logits, or hidden states when the head is fused (`fused_head`).
    Rows with recorded experts (`routing`) run in one forward routed by them (routing replay;
    `tally` counts the decisions the trainer's own routing would have made otherwise)."""
    device = next(model.parameters()).device
    head = fused_head(model) if fused else None
    net = _HiddenView(head[0]) if head is not None else model
    if F.ROUTING in batch:
        return device, head, [(torch.arange(len(batch)), _logits_full(net, batch, device, (model, tally)))]
    first, run = prompt_groups(batch) if share_prompts else (None, None)
    if first is not None and len(first) < len(batch):
        return device, head, _pieces_shared_prompt(net, batch, first, run, device)
    return device, head, [(torch.arange(len(batch)), _logits_full(net, batch, device))]


def response_logprobs(model: torch.nn.Module, batch: Batch, temperature: float = 1.0,
                      with_entropy: bool = False, entropy_grad: bool = False,
                      share_prompts: bool = True, fused: bool = True,
                      tally: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs [B, R] of the response tokens (and entropy [B, R]) under `model`; 0 on
    response padding.

    Runs with whatever grad mode the caller set; callers split into micro-batches. With
    `share_prompts`, rows that repeat the previous row's prompt reuse its forward pass.
    `fused` (where `fused_head` allows it): no full logits (module docstring); False: the
    plain path through logits (the reference the fused one is tested against).
    `tally`: with routing replay, adds the routing decisions replayed and those the trainer
    would have made otherwise (`baton.models.moe.replay_routing`).
    """
    device, head, pieces = _response_pieces(model, batch, share_prompts, fused, tally)
    t = temperature if temperature > 0 else 1.0
    R = batch[F.RESPONSE_IDS].shape[1]
    order, logps, ents = [], [], []
    for rows, states in pieces:  # states: logits [b, L, V], or hidden states [b, L, H] (fused)
        L = states.shape[1]
        labels = batch[F.RESPONSE_IDS][rows, :L].to(device)  # [b, L]
        if head is not None:  # an entropy is a metric unless an entropy bonus needs its gradient
            logp, ent = linear_logprobs(states, head[1], labels, t, with_entropy, entropy_grad)
        else:
            logits = upcast(states)  # [b, L, V]
            logp = logprobs_from_logits(logits, labels, temperature=t)
            ent = (entropy_from_logits(logits if entropy_grad else logits.detach(), temperature=t)
                   if with_entropy else None)
        logps.append(torch.nn.functional.pad(logp, (0, R - L)))
        if with_entropy:
            ents.append(torch.nn.functional.pad(ent, (0, R - L)))
        order.append(rows)
    inverse = torch.argsort(torch.cat(order)).to(device)  # rows back in batch order
    logp = torch.cat(logps)[inverse]  # [B, R]
    return logp, (torch.cat(ents)[inverse] if with_entropy else None)


def response_topk(model: torch.nn.Module, batch: Batch, temperature: float = 1.0, *, k: int = 0,
                  ids: torch.Tensor | None = None, entropy_grad: bool = False,
                  share_prompts: bool = True) -> dict[str, torch.Tensor]:
    """The model's whole next-token distribution at each response position, kept at K tokens:
    `ids` [B, R, K] given (another model's top K: the student's logprobs of the teacher's
    tokens), else its own K most likely (k = 0: the whole vocabulary, in id order).

    Returns {"logprobs" [B, R] of the sampled tokens, "entropy" [B, R], "topk_logprobs"
    [B, R, K], "topk_ids" [B, R, K]}, fp32 (logits upcast), at `temperature`; 0 (id 0) on
    response padding. Builds the full logits [b, L, V] of a bucket (the fused head too): a
    distillation loss over the vocabulary needs them, a vocabulary of 150k wants a small K.
    """
    device, head, pieces = _response_pieces(model, batch, share_prompts, fused=True)
    t = temperature if temperature > 0 else 1.0
    R = batch[F.RESPONSE_IDS].shape[1]
    order, outs = [], []
    for rows, states in pieces:
        L = states.shape[1]
        logits = upcast(states @ head[1].T if head is not None else states)  # [b, L, V]
        lsm = torch.log_softmax(logits / t, dim=-1)  # [b, L, V]
        labels = batch[F.RESPONSE_IDS][rows, :L].to(device)  # [b, L]
        if ids is not None:
            top_ids = ids[rows, :L].to(device)  # [b, L, K]
            top = lsm.gather(-1, top_ids)  # [b, L, K]
        elif k:
            top, top_ids = lsm.topk(min(k, lsm.shape[-1]), dim=-1)  # [b, L, K] each
        else:
            top, top_ids = lsm, torch.arange(lsm.shape[-1], device=device).expand_as(lsm)  # [b, L, V]
        p_log = lsm if entropy_grad else lsm.detach()
        piece = {"logprobs": lsm.gather(-1, labels[..., None])[..., 0],  # [b, L]
                 "entropy": -(p_log.exp() * p_log).sum(-1),  # [b, L]
                 "topk_logprobs": top, "topk_ids": top_ids}
        outs.append({key: torch.nn.functional.pad(v, (0, 0, 0, R - L) if v.dim() == 3 else (0, R - L))
                     for key, v in piece.items()})
        order.append(rows)
    inverse = torch.argsort(torch.cat(order)).to(device)  # rows back in batch order
    return {key: torch.cat([o[key] for o in outs])[inverse] for key in outs[0]}


@torch.no_grad()
def batched_logprobs(model: torch.nn.Module, batch: Batch, micro_batch_size: int,
                     temperature: float = 1.0, with_entropy: bool = False) -> Batch:
    """Inference-mode logprobs over micro-batches; returns a Batch of the new fields."""
    logps, ents = [], []
    for micro in batch.minibatches(max(1, micro_batch_size), shuffle=False):
        logp, ent = response_logprobs(model, micro, temperature, with_entropy)
        logps.append(logp)  # on the worker's device: the call's boundary moves the result once
        if ent is not None:
            ents.append(ent)
    out = {"logprobs": torch.cat(logps)}
    if ents:
        out[F.ENTROPY] = torch.cat(ents)
    return Batch(out)


@torch.no_grad()
def batched_topk(model: torch.nn.Module, batch: Batch, micro_batch_size: int, temperature: float,
                 k: int) -> dict[str, torch.Tensor]:
    """`response_topk` (the model's own top `k`; 0: the whole vocabulary) in inference mode
    over micro-batches: {"logprobs" [B, R], "topk_logprobs" [B, R, K], "topk_ids" [B, R, K]}."""
    outs = [response_topk(model, micro, temperature, k=k)
            for micro in batch.minibatches(max(1, micro_batch_size), shuffle=False)]
    return {key: torch.cat([o[key] for o in outs]) for key in ("logprobs", "topk_logprobs", "topk_ids")}
