"""The fast path's mixture-of-experts MLP (`llama.LlamaRunner` on Qwen3-MoE / Mixtral layers).

A sparse block's weights are read as transformers stacks them (`experts.gate_up_proj`
[E, 2I, H], `experts.down_proj` [E, H, I]), transposed to [E, H, 2I] / [E, I, H] (a
contiguous copy with `fuse=True`, refilled in place by the next pack like the dense pieces;
views otherwise). The router is HF's: logits = h @ W^T, a float softmax, top-k, renormalised
where the family does (`baton.models.moe`), weights in the activations' dtype.

The experts' matmuls are grouped, never one launch per expert in decode:
  * decode (`grouped=True`), N rows x K experts <= E: each row's K experts' weights gathered
    ([N*K, H, 2I]) and two `bmm`s; more slots than experts: every expert over every row (two
    `bmm`s over [E, N, ...]) weighted by a dense [N, E] matrix (zero off the top-k). Either way
    a fixed handful of kernels, shapes fixed by N, no host read (a CUDA graph captures it);
  * prefill: the (row, k) slots sorted by expert, one matmul pair per expert over its
    contiguous slice, scattered back with `index_add_` (one host read of the counts).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional

from baton.models.moe import renormalises


class Experts(NamedTuple):
    """A sparse block's weights as the fast path reads them (a tuple: `weights_key` sees its tensors)."""
    router: torch.Tensor  # [H, E]
    gate_up: torch.Tensor  # [E, H, 2I] (gate | up)
    down: torch.Tensor  # [E, I, H]
    top_k: int
    renorm: bool


def experts_of(mlp: nn.Module) -> nn.Module | None:
    """The block itself when `mlp` is a mixture of experts (a `gate` router beside `experts`), else None."""
    return mlp if hasattr(mlp, "experts") and hasattr(mlp, "gate") else None


def expert_pieces(block: nn.Module, fuse: bool, into: Experts | None) -> Experts:
    gate_up = block.experts.gate_up_proj.detach().transpose(1, 2)
    down = block.experts.down_proj.detach().transpose(1, 2)
    if fuse:
        if isinstance(into, Experts) and into.gate_up.shape == gate_up.shape and into.gate_up.dtype == gate_up.dtype:
            gate_up, down = into.gate_up.copy_(gate_up), into.down.copy_(down)  # the same addresses
        else:
            gate_up, down = gate_up.contiguous(), down.contiguous()
    router = block.gate
    return Experts(router.weight.detach().t(), gate_up, down, int(router.top_k), renormalises(router))


def route(h: torch.Tensor, ex: Experts) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's routing of h [N, H]: (weights [N, K] in h's dtype, expert indices [N, K])."""
    probs = torch.softmax((h @ ex.router).float(), dim=-1)
    top, index = torch.topk(probs, ex.top_k, dim=-1)
    if ex.renorm:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(h.dtype), index


def moe_forward(h: torch.Tensor, ex: Experts, grouped: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's output for h [N, H] and the experts each row went to [N, K]."""
    w, index = route(h, ex)
    if not grouped:
        return _sorted(h, ex, w, index), index
    N, K, E = h.shape[0], ex.top_k, ex.gate_up.shape[0]
    if N * K <= E:  # gather each row's experts
        flat = index.reshape(-1)
        y = torch.bmm(h.repeat_interleave(K, 0)[:, None], ex.gate_up[flat])  # [N*K, 1, 2I]
        g, u = y.chunk(2, dim=-1)
        o = torch.bmm(functional.silu(g) * u, ex.down[flat]).view(N, K, -1)  # [N, K, H]
        return (o * w[..., None]).sum(1), index
    y = torch.matmul(h[None], ex.gate_up)  # every expert over every row: [E, N, 2I]
    g, u = y.chunk(2, dim=-1)
    o = torch.bmm(functional.silu(g) * u, ex.down)  # [E, N, H]
    dense = torch.zeros(N, E, dtype=h.dtype, device=h.device).scatter_(1, index, w)
    return torch.einsum("enh,ne->nh", o, dense), index


def _sorted(h: torch.Tensor, ex: Experts, w: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    K, E = ex.top_k, ex.gate_up.shape[0]
    flat = index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    rows, weights = order // K, w.reshape(-1)[order]
    out = torch.zeros_like(h)
    start = 0
    for e, count in enumerate(torch.bincount(flat, minlength=E).tolist()):
        if count:
            r = rows[start:start + count]
            g, u = (h[r] @ ex.gate_up[e]).chunk(2, dim=-1)
            out.index_add_(0, r, (functional.silu(g) * u) @ ex.down[e] * weights[start:start + count, None])
            start += count
    return out
