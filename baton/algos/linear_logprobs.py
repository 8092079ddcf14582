"""Token logprobs (and entropies) straight from the final hidden states and the output
projection, in chunks of tokens, never holding the full [N, V] logits, in forward or backward.

At a 152k vocabulary, the logits of 64 x 64 tokens are ~2.5 GB in float32, and autograd
keeps them (and the log-softmax's output) for backward. `linear_logprobs(hidden, weight,
labels)` computes, per chunk of `CHUNK_ELEMENTS // V` tokens, z = (hidden @ weight.T) / T
in at least float32, logsumexp, the label's logprob and (asked for) the entropy, and keeps
only hidden, weight and per-token [N] results; its backward recomputes each chunk's logits
and turns them into the chunk's gradients of hidden and weight (the approach of Liger's
fused linear cross-entropy and Apple's cut-cross-entropy, written plainly in torch).

Numerics are those of `baton.algos.logprobs` on the logits of `hidden @ weight.T`: the
logits in the matmul dtype (the autocast dtype under autocast, else the inputs'), upcast to
>= float32, then multiplied by 1/T (temperature 0 = 1, as there). Gradients, for
log p = z_y - lse(z) and H = lse(z) - sum p z with p = softmax(z):
    d log p / dz = onehot(y) - p,    dH / dz = -p (z - lse + H),    d / dlogits = d / dz / T.
"""

from __future__ import annotations

import torch

from baton.algos.logprobs import _inv_temperature, upcast

CHUNK_ELEMENTS = 1 << 24  # logits per chunk: 64 MiB in float32 (110 tokens at V = 152k)


def _matmul_dtype(hidden: torch.Tensor) -> torch.dtype:
    dev = hidden.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else hidden.dtype


def _scaled_logits(h: torch.Tensor, w: torch.Tensor, inv_t: float) -> torch.Tensor:
    """z [c, V] = upcast(h @ w.T) / T; h [c, H] and w [V, H] already in the matmul dtype."""
    with torch.autocast(h.device.type, enabled=False):
        z = upcast(h @ w.T)  # a fresh tensor: scaling it in place is safe
    return z if inv_t == 1.0 else z.mul_(inv_t)


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, inv_t, with_entropy, chunk, mm_dtype):
        ctx.set_materialize_grads(False)
        w = weight.to(mm_dtype)
        logps, lses, ents = [], [], []
        for s in range(0, hidden.shape[0], chunk):
            z = _scaled_logits(hidden[s:s + chunk].to(mm_dtype), w, inv_t)  # [c, V]
            lse = torch.logsumexp(z, dim=-1)  # [c]
            logps.append(z.gather(-1, labels[s:s + chunk, None])[:, 0] - lse)
            lses.append(lse)
            if with_entropy:
                ents.append(lse - (torch.softmax(z, dim=-1) * z).sum(-1))
        logp = torch.cat(logps) if logps else hidden.new_zeros(0, dtype=upcast(hidden[:0]).dtype)
        lse = torch.cat(lses) if lses else logp
        ent = torch.cat(ents) if ents else logp.new_zeros(0)
        ctx.save_for_backward(hidden, weight, labels, lse, ent)
        ctx.inv_t, ctx.chunk, ctx.mm_dtype = inv_t, chunk, mm_dtype
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, labels, lse, ent = ctx.saved_tensors
        if g_ent is not None and ent.numel() == 0:
            g_ent = None
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gh = torch.empty_like(hidden) if need_h else None
        gw = torch.zeros_like(weight) if need_w else None
        if (g_logp is None and g_ent is None) or not (need_h or need_w):
            return (gh.zero_() if gh is not None else None), gw, None, None, None, None, None
        w = weight.to(ctx.mm_dtype)
        for s in range(0, hidden.shape[0], ctx.chunk):
            e = s + ctx.chunk
            h = hidden[s:e].to(ctx.mm_dtype)
            z = _scaled_logits(h, w, ctx.inv_t)  # [c, V], recomputed
            p = torch.softmax(z, dim=-1)  # [c, V]
            dz = torch.zeros_like(z)
            if g_logp is not None:
                g = g_logp[s:e].to(z.dtype)  # [c]
                dz.sub_(p * g[:, None]).scatter_add_(-1, labels[s:e, None], g[:, None])
            if g_ent is not None:
                shift = (ent[s:e] - lse[s:e]).to(z.dtype)  # [c]: H - lse
                dz.sub_(p * (z + shift[:, None]) * g_ent[s:e].to(z.dtype)[:, None])
            if ctx.inv_t != 1.0:
                dz.mul_(ctx.inv_t)
            d = dz.to(ctx.mm_dtype)  # d loss / d logits [c, V]
            with torch.autocast(h.device.type, enabled=False):
                if need_h:
                    gh[s:e] = d @ w
                if need_w and d.dtype == gw.dtype:
                    gw.addmm_(d.T, h)  # in place: no [V, H] temporary per chunk
                elif need_w:
                    gw += (d.T @ h).to(gw.dtype)
        return gh, gw, None, None, None, None, None


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                    temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False,
                    chunk_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ weight.T / T) at `labels`, and its entropy when asked.

    hidden [..., H], weight [V, H] (an output projection without bias), labels [...] long
    (valid ids everywhere: mask padding separately). Returns logp [...] and entropy [...]
    or None, float32 (float64 for float64 inputs). The entropy carries a gradient only with
    `entropy_grad` (else it is a metric, detached). chunk_tokens: tokens per chunk (default:
    CHUNK_ELEMENTS // V)."""
    inv_t = _inv_temperature(temperature)
    shape = labels.shape
    h = hidden.reshape(-1, hidden.shape[-1])  # [N, H]
    y = labels.reshape(-1).to(hidden.device)  # [N]
    chunk = max(1, chunk_tokens or CHUNK_ELEMENTS // weight.shape[0])
    logp, ent = _LinearLogprobs.apply(h, weight, y, inv_t, with_entropy, chunk, _matmul_dtype(hidden))
    if not with_entropy:
        return logp.reshape(shape), None
    return logp.reshape(shape), (ent if entropy_grad else ent.detach()).reshape(shape)
