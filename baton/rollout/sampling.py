"""Token sampling for the embedded engine: temperature, top-k, top-p, min-p, greedy.

One call turns a batch of next-token logits into chosen tokens and their logprobs.
The logprob follows the protocol convention (see `baton.rollout.protocol`): log_softmax of
logits / temperature (temperature 1 when greedy), taken *before* any filtering, so the
trainer can recompute it from a plain forward pass.

Sampling uses the exponential-race form of Gumbel-max: argmax(p / E) with E ~ Exp(1) picks
index i with probability p_i. It needs no sort and no cumulative sum, unlike
`torch.multinomial`, and runs from one explicit generator, so a seed fixes the output.
"""

from __future__ import annotations

import torch

from baton.rollout.protocol import SamplingParams


def filter_logits(scaled: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Mask (with -inf) the tokens that top-k / top-p / min-p exclude. scaled: [B, V] fp32."""
    vocab = scaled.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]  # [B, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)  # [B, V]
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token)
        drop_sorted = (probs.cumsum(-1) - probs) >= params.top_p  # [B, V]
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    if params.min_p > 0.0:
        probs = scaled.softmax(-1)  # [B, V]
        floor = probs.amax(-1, keepdim=True) * params.min_p  # [B, 1]
        scaled = scaled.masked_fill(probs < floor, float("-inf"))
    return scaled


def sample(logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row. logits: [B, V] (any float dtype). Returns (tokens [B] long,
    logprobs [B] fp32)."""
    logits = logits.float()  # [B, V]
    greedy = params.temperature == 0.0
    scaled = logits if greedy or params.temperature == 1.0 else logits / params.temperature
    logprobs_all = torch.log_softmax(scaled, dim=-1)  # [B, V] convention: before filtering
    if greedy or params.top_k == 1:
        tokens = scaled.argmax(-1)  # [B]
    else:
        filtered = filter_logits(scaled, params)
        if filtered is scaled:
            probs = logprobs_all.exp()  # [B, V] reuse the log_softmax: one exp, no new softmax
        else:
            probs = filtered.softmax(-1)
        # Exp(1) draws; clamped because an exact 0 would turn a filtered (p = 0) token into NaN
        race = torch.empty_like(probs).exponential_(generator=generator).clamp_min_(1e-30)  # [B, V]
        tokens = (probs / race).argmax(-1)  # [B]
    logprobs = logprobs_all.gather(-1, tokens[:, None]).squeeze(-1)  # [B]
    return tokens, logprobs
