"""Mixture-of-experts layers of a transformers causal LM: find their routers, watch them, steer them.

transformers' MoE families (Qwen3-MoE, Mixtral, ...) put a `gate` router (`...TopKRouter`:
`weight` [E, H], `top_k`, `num_experts`, returning `(logits, top-k weights, top-k indices)`)
beside stacked `experts` in every sparse block. This module works on any block of that shape:

  * `routers(model)`: the routers in layer order (PEFT and DDP wrappers looked through);
  * `RouterWatch`: a context that records each router call's logits and chosen experts;
  * `load_balancing_loss`: the Switch-Transformer auxiliary loss over recorded logits
    (`actor.router_aux_loss_coef`), the same formula as transformers' `load_balancing_loss_func`;
  * `replay_routing`: a context in which each router picks the experts it is given instead of
    its own top-k (routing replay, `rollout.routing_replay`): the gate's softmax is still
    computed and differentiated, its weights are read at the replayed experts (and
    renormalised where the family renormalises its top-k).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


def _is_router(m: nn.Module) -> bool:
    return all(hasattr(m, a) for a in ("top_k", "num_experts", "weight")) and type(m).__name__.endswith("Router")


def routers(model: nn.Module) -> list[nn.Module]:
    """The model's MoE routers, in layer order ([] for a dense model)."""
    return [m for m in model.modules() if _is_router(m)]


def is_moe(model: nn.Module) -> bool:
    return bool(routers(model))


def renormalises(router: nn.Module) -> bool:
    """Whether the family renormalises its top-k weights to sum to 1 (Mixtral always; Qwen3-MoE
    when `norm_topk_prob`)."""
    return bool(getattr(router, "norm_topk_prob", type(router).__name__.startswith("Mixtral")))


def _weights_at(router: nn.Module, logits: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    probs = torch.softmax(logits.float(), dim=-1)
    top = probs.gather(-1, index)
    if renormalises(router):
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(dtype)  # the dtype the family's own router returns


class RouterWatch:
    """`with RouterWatch(model) as w:` records every router call: `w.logits[i]` / `w.experts[i]`
    are lists (one entry per call) of the i-th router's [tokens, E] logits and [tokens, K]
    chosen experts."""

    def __init__(self, model: nn.Module):
        self.routers = routers(model)
        self.logits: list[list[torch.Tensor]] = [[] for _ in self.routers]
        self.experts: list[list[torch.Tensor]] = [[] for _ in self.routers]
        self._hooks: list = []

    def __enter__(self) -> "RouterWatch":
        for i, r in enumerate(self.routers):
            self._hooks.append(r.register_forward_hook(self._hook(i)))
        return self

    def _hook(self, i: int):
        def record(_module, _inputs, out):
            self.logits[i].append(out[0])
            self.experts[i].append(out[2].detach())
        return record

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def load_balancing_loss(watch: RouterWatch) -> torch.Tensor:
    """transformers' `load_balancing_loss_func` over every token every router saw: E * sum_e
    f_e * P_e, f_e the share of tokens (per layer, pooled over layers) routed to expert e
    (summing to top-k), P_e its mean gate probability. top-k when perfectly balanced;
    differentiable through P_e."""
    seen = [(r, torch.cat(lg).float()) for r, lg in zip(watch.routers, watch.logits) if lg]
    if not seen:
        raise ValueError("router_aux_loss_coef > 0 needs a mixture-of-experts model (no router ran)")
    n_experts = seen[0][0].num_experts
    counts = torch.zeros(n_experts, device=seen[0][1].device)
    prob_sum = torch.zeros(n_experts, device=seen[0][1].device)
    rows = 0
    for r, lg in seen:
        probs = torch.softmax(lg, dim=-1)  # [N, E]
        chosen = torch.topk(probs, r.top_k, dim=-1).indices
        counts = counts.scatter_add(0, chosen.reshape(-1), torch.ones(chosen.numel(), device=lg.device))
        prob_sum = prob_sum + probs.sum(0)
        rows += lg.shape[0]
    return n_experts * ((counts / rows) * (prob_sum / rows)).sum()


@contextlib.contextmanager
def replay_routing(model: nn.Module, experts: list[torch.Tensor | None]) -> Iterator[None]:
    """Inside, router i routes the tokens of its next call by `experts[i]` ([tokens, K] expert
    indices, -1 = route freely) instead of its own top-k; `None` leaves router i alone. The
    tokens are the router's flattened input ([batch * seq, H]), in that order."""
    rs = routers(model)
    if len(experts) != len(rs):
        raise ValueError(f"replay_routing: {len(experts)} layers of experts for {len(rs)} routers")
    saved = []
    for r, given in zip(rs, experts):
        saved.append((r, r.forward))
        if given is not None:
            r.forward = _replaying(r, r.forward, given)
    try:
        yield
    finally:
        for r, fwd in saved:
            r.forward = fwd


def _replaying(router: nn.Module, own, given: torch.Tensor):
    def forward(hidden_states: torch.Tensor):
        logits, weights, index = own(hidden_states)
        g = given.to(index.device)
        if g.shape != index.shape:
            raise ValueError(f"replay_routing: experts for {tuple(g.shape)} slots, the router saw {tuple(index.shape)}")
        free = (g < 0).all(-1, keepdim=True)
        index = torch.where(free, index, g.clamp(min=0))
        return logits, _weights_at(router, logits, index, weights.dtype), index
    return forward
