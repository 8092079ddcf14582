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


def response_logprobs(model: torch.nn.Module, batch: Batch, temperature: float = 1.0,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs [B, R] of the response tokens (and entropy [B, R]) under `model`.

    Runs with whatever grad mode the caller set; callers split into micro-batches.
    """
    inputs = {k: v.to(next(model.parameters()).device) for k, v in model_inputs(batch).items()}
    P = batch[F.PROMPT_IDS].shape[1]
    R = batch[F.RESPONSE_IDS].shape[1]
    logits = model(**inputs, use_cache=False).logits[:, P - 1:P + R - 1]  # [B, R, V]
    logits = logits.float()
    t = temperature if temperature > 0 else 1.0
    labels = inputs["input_ids"][:, P:]  # [B, R]
    logp = logprobs_from_logits(logits, labels, temperature=t)  # [B, R]
    ent = entropy_from_logits(logits, temperature=t) if with_entropy else None  # [B, R]
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
