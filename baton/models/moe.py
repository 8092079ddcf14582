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


EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")  # config.json's names for it


def dense_on_disk(path: str) -> bool:
    """True when the local model dir's config.json names no experts (a dense model); False for
    a mixture of experts, or where there is no such file to read (a hub id: left to the load)."""
    import json
    from pathlib import Path

    file = Path(path) / "config.json"
    if not file.is_file():
        return False
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return False  # a torn config.json: the checkpoint check names it
    return not any(config.get(k) for k in EXPERT_COUNT_KEYS)


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


def check_routing(routing: torch.Tensor, model: nn.Module) -> None:
    """ValueError, one line naming the first row, unless `routing` [B, R, L, K] (a batch's
    recorded experts, -1 where none) fits the model: L MoE layers, top-K, experts in range."""
    rs = routers(model)
    if not rs:
        raise ValueError(f"row 0: recorded experts (routing) for a model with no mixture-of-experts layers "
                         f"({type(model).__name__})")
    B, R, L, K = routing.shape
    if (L, K) != (len(rs), rs[0].top_k):
        raise ValueError(f"row 0: recorded experts for {L} MoE layers x top-{K}; the model routes {len(rs)} layers x "
                         f"top-{rs[0].top_k} (rows from another model?)")
    n_experts = rs[0].num_experts
    bad = ((routing < -1) | (routing >= n_experts)).nonzero()
    if len(bad):
        b, t, layer, _ = bad[0].tolist()
        raise ValueError(f"row {b}: recorded expert {int(routing[b, t, layer].max())} at response token {t}, "
                         f"MoE layer {layer}: the model has experts 0..{n_experts - 1}")


def routing_at_positions(routing: torch.Tensor, prompt_width: int) -> list[torch.Tensor]:
    """Per MoE layer, the experts of a forward over [prompt (left-padded to prompt_width) |
    response] rows as the routers see them ([B * T, K]): response token t's experts at the
    position that predicts it (prompt_width - 1 + t), -1 (free) everywhere else."""
    B, R, L, K = routing.shape
    out = routing.new_full((L, B, prompt_width + R, K), -1)
    out[:, :, prompt_width - 1:prompt_width - 1 + R] = routing.permute(2, 0, 1, 3)
    return list(out.reshape(L, -1, K))


@contextlib.contextmanager
def replay_routing(model: nn.Module, experts: list[torch.Tensor | None], tally: dict | None = None) -> Iterator[None]:
    """Inside, router i routes the tokens of its next call by `experts[i]` ([tokens, K] expert
    indices, -1 = route freely) instead of its own top-k; `None` leaves router i alone. The
    tokens are the router's flattened input ([batch * seq, H]), in that order. `tally`: adds
    "routing_replayed" (token x layer decisions replayed) and "routing_differ" (those whose
    own top-k set differs from the replayed one), as tensors (no host read)."""
    rs = routers(model)
    if len(experts) != len(rs):
        raise ValueError(f"replay_routing: {len(experts)} layers of experts for {len(rs)} routers")
    saved = []
    for r, given in zip(rs, experts):
        saved.append((r, r.forward))
        if given is not None:
            r.forward = _replaying(r, r.forward, given, tally)
    try:
        yield
    finally:
        for r, fwd in saved:
            r.forward = fwd


def _replaying(router: nn.Module, own, given: torch.Tensor, tally: dict | None):
    def forward(hidden_states: torch.Tensor):
        logits, weights, index = own(hidden_states)
        g = given.to(index.device)
        if g.shape != index.shape:
            raise ValueError(f"replay_routing: experts for {tuple(g.shape)} slots, the router saw {tuple(index.shape)}")
        free = (g < 0).all(-1, keepdim=True)
        if tally is not None:
            differ = (index.sort(-1).values != g.sort(-1).values).any(-1) & ~free[:, 0]
            for key, value in (("routing_replayed", (~free).sum()), ("routing_differ", differ.sum())):
                tally[key] = tally.get(key, 0) + value.detach().double()
        index = torch.where(free, index, g.clamp(min=0))
        return logits, _weights_at(router, logits, index, weights.dtype), index
    return forward
