"""Token log-probabilities and entropies from logits, at the sampling temperature.

Memory: for a [B, R, V] logit tensor with V ~ 150k, `log_softmax` materialises a second
[B, R, V] tensor. Here log p(label) = logit[label] / T - logsumexp(logits / T) keeps only
[B, R] results, and logits are upcast to float32 and divided by T in chunks of tokens
(~64 MiB of float32 each), so the extra memory is a few chunks instead of [B, R, V]
copies. This helps forward-only passes (old / reference logprobs under no_grad); with
autograd, backward still needs its saved inputs. Dividing after the upcast also avoids
a bf16 rounding of logits / T.
"""

from __future__ import annotations

import torch


def upcast(t: torch.Tensor) -> torch.Tensor:
    """At least float32 (bf16 / fp16 -> float32; float32 and float64 as they are), so that a
    float64 model, which the numerics tests use, stays float64 all the way to its loss."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _inv_temperature(temperature: float) -> float:
    # Temperature 0 means greedy sampling; by the Engine protocol its logprobs are taken at
    # temperature 1, so the trainer's ratio of an unchanged policy is exactly 1.
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return 1.0 if temperature == 0 else 1.0 / temperature


# Tokens per chunk so that one float32 chunk is ~64 MiB: e.g. 110 tokens at V = 152k.
CHUNK_ELEMENTS = 1 << 24


def _chunked(fn, logits: torch.Tensor, inv_t: float) -> torch.Tensor:
    """fn(z [..., V] in >= float32, already divided by T) -> [...], applied to chunks of tokens.

    Chunks are taken inside each row (never by reshaping [B, R, V] to [B*R, V], which copies
    the whole tensor when the logits are a slice of a [B, T, V] forward pass).
    """
    def scaled(c: torch.Tensor) -> torch.Tensor:  # c [..., V]
        if c.dtype in (torch.float32, torch.float64):
            return fn(c if inv_t == 1.0 else c * inv_t)  # c may be a view: never in place
        z = c.float()  # a fresh copy, so scaling it in place is safe (neither op saves its input)
        return fn(z.mul_(inv_t) if inv_t != 1.0 else z)

    rows = logits.unsqueeze(0) if logits.dim() == 2 else logits  # [B, R, V]
    per_row = rows.shape[1] * rows.shape[2]
    if per_row <= CHUNK_ELEMENTS:  # blocks of whole rows (views along B): few, large calls
        block = max(1, CHUNK_ELEMENTS // max(1, per_row))
        out = torch.cat([scaled(b) for b in rows.split(block)])  # [B, R]
    else:  # a single row is larger than a chunk: split inside each row
        n = max(1, CHUNK_ELEMENTS // logits.shape[-1])
        out = torch.stack([torch.cat([scaled(c) for c in row.split(n)]) for row in rows])  # [B, R]
    return out[0] if logits.dim() == 2 else out


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor,
                         temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / temperature) gathered at `labels`.

    logits [B, R, V] (any float dtype), labels [B, R] long (valid ids everywhere: mask
    padding separately, do not use -100). Returns float32 (float64 for float64 input) [B, R].
    """
    inv_t = _inv_temperature(temperature)
    lse = _chunked(lambda z: torch.logsumexp(z, dim=-1), logits, inv_t)  # [B, R]
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).to(lse.dtype)  # [B, R]
    return picked * inv_t - lse  # [B, R]


def _entropy(z: torch.Tensor) -> torch.Tensor:
    # H = logsumexp(z) - sum softmax(z) * z: no [.., V] log-prob tensor is kept.
    p = torch.softmax(z, dim=-1)  # [.., V]
    return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)  # [..]


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position: [B, R, V] -> [B, R]."""
    return _chunked(_entropy, logits, _inv_temperature(temperature))  # [B, R]
