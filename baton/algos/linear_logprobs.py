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

The weight's gradient (`accumulate_wgrad`) is summed over chunks in one buffer of the
weight's dtype, in place: fp32 master weights under bf16 autocast get the bf16 chunk
products summed in fp32 with no [V, H] temporary per chunk (before issue 43: a bf16
[V, H] product, its fp32 copy and an add, ~2.7 GB of traffic a chunk at 0.5B). It differs
from that path by the bf16 rounding of each chunk's product (<= 2^-8 of its magnitude),
which it no longer makes; in fp32 both are the same addmm, bit for bit.
"""

from __future__ import annotations

import logging

import torch

from baton.algos.logprobs import _inv_temperature, upcast

log = logging.getLogger("baton.algos.linear_logprobs")
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
    def forward(ctx, hidden, weight, labels, inv_t, with_entropy, chunk, mm_dtype, fused_wgrad):
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
        ctx.inv_t, ctx.chunk, ctx.mm_dtype, ctx.fused_wgrad = inv_t, chunk, mm_dtype, fused_wgrad
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
            return (gh.zero_() if gh is not None else None), gw, None, None, None, None, None, None
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
                if need_w:
                    (accumulate_wgrad if ctx.fused_wgrad else _accumulate_wgrad_unfused)(gw, d, h, dz)
        return gh, gw, None, None, None, None, None, None


def accumulate_wgrad(gw: torch.Tensor, d: torch.Tensor, h: torch.Tensor, scratch: torch.Tensor) -> None:
    """gw [V, H] += d.T @ h (d [c, V], h [c, H] in the matmul dtype), accumulated in gw's
    dtype with no [V, H] temporary: the products of the matmul-dtype values, summed in gw's
    dtype (fp32 master weights under bf16 autocast: the bf16 inputs' exact products summed
    in fp32, as the one GEMM of `_mixed_addmm_ok` computes them).

    Same dtypes: one in-place addmm. Mixed (bf16 logits' gradient, fp32 gradient buffer):
    on a device whose GEMM takes bf16 inputs with an fp32 output (CUDA, `_mixed_addmm_ok`),
    that GEMM accumulating into gw in place; elsewhere the chunk's operands upcast (d's
    values rounded to the matmul dtype are written into `scratch`, the chunk's fp32 [c, V]
    gradient, so the only new tensor is h's [c, H] upcast) and an fp32 addmm. Exact in
    fp32 terms either way: a bf16 value is exact in fp32 (and in TF32)."""
    if d.dtype == gw.dtype:
        gw.addmm_(d.T, h)
    elif _mixed_addmm_ok(gw.device, d.dtype, gw.dtype):
        torch.addmm(gw, d.T, h, out_dtype=gw.dtype, out=gw)
    else:
        up = scratch.copy_(d) if scratch.dtype == gw.dtype and scratch.shape == d.shape else d.to(gw.dtype)
        gw.addmm_(up.T, h.to(gw.dtype))


def _accumulate_wgrad_unfused(gw: torch.Tensor, d: torch.Tensor, h: torch.Tensor, scratch: torch.Tensor) -> None:
    """The path before issue 43, kept to compare with (tests, bench/wgrad_backward.py): a
    [V, H] product in the matmul dtype, its copy in gw's dtype and an add, per chunk."""
    if d.dtype == gw.dtype:
        gw.addmm_(d.T, h)
    else:
        gw += (d.T @ h).to(gw.dtype)


_MIXED_ADDMM: dict[tuple, bool] = {}  # (device type, in dtype, out dtype) -> the probe's verdict


def _mixed_addmm_ok(device: torch.device, in_dtype: torch.dtype, out_dtype: torch.dtype) -> bool:
    """Whether `torch.addmm(c, a, b, out_dtype=, out=c)` with `in_dtype` inputs runs on this
    device and adds the product into c in place (CUDA in recent torch; not the CPU; never run
    on the GPU machine's torch 2.11): probed once per (device type, dtypes) on a 2 x 2
    product, the verdict logged; `accumulate_wgrad` upcasts where it is no."""
    key = (device.type, in_dtype, out_dtype)
    if key not in _MIXED_ADDMM:
        a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
        c = torch.ones(2, 2, dtype=out_dtype, device=device)
        try:
            torch.addmm(c, a.to(in_dtype), a.T.to(in_dtype), out_dtype=out_dtype, out=c)
            _MIXED_ADDMM[key] = bool(torch.equal(c.cpu(), torch.tensor([[6.0, 12.0], [12.0, 26.0]], dtype=out_dtype)))
        except (RuntimeError, TypeError, NotImplementedError):
            _MIXED_ADDMM[key] = False
        # the verdict, once: on a GPU whose torch says no, each chunk's operands are upcast
        log.info("addmm of %s inputs into %s in place on %s (torch %s): %s", in_dtype, out_dtype, device.type,
                 torch.__version__, "yes, one GEMM a chunk" if _MIXED_ADDMM[key] else "no, the operands upcast")
    return _MIXED_ADDMM[key]


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                    temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False,
                    chunk_tokens: int | None = None, fused_wgrad: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ weight.T / T) at `labels`, and its entropy when asked.

    hidden [..., H], weight [V, H] (an output projection without bias), labels [...] long
    (valid ids everywhere: mask padding separately). Returns logp [...] and entropy [...]
    or None, float32 (float64 for float64 inputs). The entropy carries a gradient only with
    `entropy_grad` (else it is a metric, detached). chunk_tokens: tokens per chunk (default:
    CHUNK_ELEMENTS // V). fused_wgrad=False: the weight gradient the way it was accumulated
    before issue 43 (`_accumulate_wgrad_unfused`), for comparisons only."""
    inv_t = _inv_temperature(temperature)
    shape = labels.shape
    h = hidden.reshape(-1, hidden.shape[-1])  # [N, H]
    y = labels.reshape(-1).to(hidden.device)  # [N]
    chunk = max(1, chunk_tokens or CHUNK_ELEMENTS // weight.shape[0])
    logp, ent = _LinearLogprobs.apply(h, weight, y, inv_t, with_entropy, chunk, _matmul_dtype(hidden),
                                      fused_wgrad)
    if not with_entropy:
        return logp.reshape(shape), None
    return logp.reshape(shape), (ent if entropy_grad else ent.detach()).reshape(shape)
