"""Turn rollouts into model inputs and model outputs into per-response-token logprobs.

Shared by the actor (current and old logprobs) and the reference (frozen logprobs), so both
see exactly the same inputs as the rollout engine: prompts left-padded, responses
right-padded, position ids = cumsum(attention_mask) - 1 (the engine's convention).
"""

from __future__ import annotations

import torch

from baton import fields as F
from baton.algos import entropy_from_logits, logprobs_from_logits
from baton.batch import Batch


def model_inputs(batch: Batch) -> dict[str, torch.Tensor]:
    prompt_ids, response_ids = batch[F.PROMPT_IDS], batch[F.RESPONSE_IDS]  # [B, P], [B, R]
    mask = torch.cat([batch[F.PROMPT_MASK], batch[F.RESPONSE_MASK]], dim=1).long()  # [B, T]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]
    return {"input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": mask, "position_ids": position_ids}


def prompt_groups(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of consecutive rows with the same prompt: (first row of each run [U], run of each row [B])."""
    ids, mask = batch[F.PROMPT_IDS], batch[F.PROMPT_MASK]  # [B, P]
    starts = torch.ones(len(ids), dtype=torch.bool)
    starts[1:] = (ids[1:] != ids[:-1]).any(1) | (mask[1:] != mask[:-1]).any(1)
    return starts.nonzero().flatten(), starts.cumsum(0) - 1


def _logits_full(model: torch.nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
    inputs = {k: v.to(device) for k, v in model_inputs(batch).items()}
    P, R = batch[F.PROMPT_IDS].shape[1], batch[F.RESPONSE_IDS].shape[1]
    return model(**inputs, use_cache=False).logits[:, P - 1:P + R - 1]  # [B, R, V]


def _logits_shared_prompt(model: torch.nn.Module, batch: Batch, first: torch.Tensor,
                          run: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The same logits as `_logits_full`, computing each distinct prompt once.

    GRPO rows come in groups of n samples of one prompt: the prompt's forward (and its
    backward) runs once per group; its KV cache is then gathered to every row and the
    responses attend to it. Gradients flow through the gathered cache into the prompt.
    """
    p_ids, p_mask = batch[F.PROMPT_IDS][first].to(device), batch[F.PROMPT_MASK][first].to(device)  # [U, P]
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)  # [U, P]
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, use_cache=True)
    run = run.to(device)
    cache = out.past_key_values
    cache.batch_select_indices(run)  # [U, ...] -> [B, ...]
    r_ids = batch[F.RESPONSE_IDS].to(device)  # [B, R]
    mask = torch.cat([batch[F.PROMPT_MASK], batch[F.RESPONSE_MASK]], 1).long().to(device)  # [B, T]
    R = r_ids.shape[1]
    r_pos = p_mask.sum(-1)[run, None] + torch.arange(R, device=device)  # [B, R] continues the prompt
    r_logits = model(input_ids=r_ids, attention_mask=mask, position_ids=r_pos,
                     past_key_values=cache, use_cache=True).logits  # [B, R, V]
    first_logits = out.logits[:, -1][run]  # [B, V]: the last prompt position predicts token 0
    return torch.cat([first_logits[:, None], r_logits[:, :-1]], dim=1)  # [B, R, V]


def response_logprobs(model: torch.nn.Module, batch: Batch, temperature: float = 1.0,
                      with_entropy: bool = False, entropy_grad: bool = False,
                      share_prompts: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs [B, R] of the response tokens (and entropy [B, R]) under `model`.

    Runs with whatever grad mode the caller set; callers split into micro-batches. With
    `share_prompts`, rows that repeat the previous row's prompt reuse its forward pass.
    """
    device = next(model.parameters()).device
    first, run = prompt_groups(batch) if share_prompts else (None, None)
    if first is not None and len(first) < len(batch):
        logits = _logits_shared_prompt(model, batch, first, run, device)
    else:
        logits = _logits_full(model, batch, device)
    logits = logits.float()
    t = temperature if temperature > 0 else 1.0
    labels = batch[F.RESPONSE_IDS].to(device)  # [B, R]
    logp = logprobs_from_logits(logits, labels, temperature=t)  # [B, R]
    ent = None
    if with_entropy:  # a metric unless an entropy bonus needs its gradient
        ent = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature=t)  # [B, R]
    return logp, ent


@torch.no_grad()
def batched_logprobs(model: torch.nn.Module, batch: Batch, micro_batch_size: int,
                     temperature: float = 1.0, with_entropy: bool = False) -> Batch:
    """Inference-mode logprobs over micro-batches; returns a Batch of the new fields."""
    logps, ents = [], []
    for micro in batch.minibatches(max(1, micro_batch_size), shuffle=False):
        logp, ent = response_logprobs(model, micro, temperature, with_entropy)
        logps.append(logp.cpu())
        if ent is not None:
            ents.append(ent.cpu())
    out = {"logprobs": torch.cat(logps)}
    if ents:
        out[F.ENTROPY] = torch.cat(ents)
    return Batch(out)
