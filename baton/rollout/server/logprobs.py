"""OpenAI `top_logprobs` (chat, up to 20) and `logprobs=N` (completions) for `baton serve`.

The engine reports the chosen token's logprob only, so the alternatives come from one
teacher-forced forward pass of prompt + completion through the served model, on the engine
thread (between generation slices, never concurrently with a weight update): per position
the k most likely tokens under log_softmax(logits / T) (T = 0: the raw logits), the same
quantity as the chosen token's logprob (`baton.protocol`). The chosen token keeps
the engine's own number. Where vLLM's server takes the alternatives from the raw logits
(its default `logprobs_mode`), baton takes them at the request's temperature, as its
chosen-token logprobs are. Engines without an in-process torch model (vLLM, remote) and
requests on a LoRA adapter answer 400 for k > 1, naming why.
"""

from __future__ import annotations

import inspect

from typing import Any

import torch



def can_score(engine: Any, lora: str | None) -> str | None:
    """None when `engine` can give top-k logprobs for a request, else why not."""
    if not isinstance(engine.model, torch.nn.Module):
        return "this engine reports the chosen token's logprob only"
    if lora is not None:
        return "not on a LoRA adapter (the chosen token's logprob only)"
    return None


@torch.no_grad()
def top_logprobs(model: torch.nn.Module, prompt: list[int], ids: list[int], temperature: float,
                 k: int) -> list[list[tuple[int, float]]]:
    """Per completion token, the k (token id, logprob) pairs with the highest logprob."""
    if not ids or k <= 0:
        return [[] for _ in ids]
    device = next(model.parameters()).device
    x = torch.tensor([prompt + ids], device=device)  # [1, P+C]
    if "logits_to_keep" in inspect.signature(model.forward).parameters:  # only the last C+1 positions' logits
        logits = model(input_ids=x, logits_to_keep=len(ids) + 1).logits[0, :len(ids)].float()  # [C, V]
    else:
        logits = model(input_ids=x).logits[0, len(prompt) - 1:len(prompt) - 1 + len(ids)].float()  # [C, V]
    if temperature > 0:
        logits = logits / temperature
    values, index = torch.log_softmax(logits, -1).topk(min(k, logits.shape[-1]), -1)  # [C, k]
    return [list(zip(i, v)) for i, v in zip(index.tolist(), values.tolist())]


async def alternatives(srv: Any, prompts: list[list[int]], comps: list[Any], temperature: float,
                       k: int) -> list[list[list[tuple[int, float]]]]:
    """top_logprobs for every completion (in order), computed on the engine thread."""
    model = srv.engine.model

    def score() -> list[list[list[tuple[int, float]]]]:
        return [top_logprobs(model, prompts[c.prompt_index], c.token_ids, temperature, k) for c in comps]

    return await srv.runner.call(score, label="top_logprobs")
