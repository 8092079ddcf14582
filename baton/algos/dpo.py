"""DPO-family losses on sequence log-probabilities, chosen by name from `DPO_LOSSES`
(shared by online DPO, which pairs its own samples with `baton.algos.pairs`, and offline DPO).

With sequence logprobs (sums over the response tokens, `sequence_logprobs`) and
    h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r))
the per-pair losses are
    sigmoid  -(1 - eps) log sigma(beta h) - eps log sigma(-beta h)   (Rafailov et al. 2023;
             eps = label_smoothing > 0 is conservative DPO, Mitchell 2023)
    ipo      (h - 1 / (2 beta))^2                                     (Azar et al. 2023)
    hinge    relu(1 - beta h)                                         (SLiC, Zhao et al. 2023)
Reference-free (`reference_free=True`): ref logprobs are 0, h = log pi(y_c) - log pi(y_r).

IPO's default is length-normalised (`length_norm=True`): each log-ratio is divided by its
response length before taking h, as TRL does (confirmed by TRL with the IPO authors: the
paper's results use the per-token average). With token sums, h grows with the length while
the target 1/(2 beta) does not, so the un-normalised squared loss would be dominated by long
pairs and beta would mean something different for every length. `length_norm=False` is the
literal eq. 17 of the paper on token sums.

`dpo_loss` returns sum_pairs loss / global_pairs: pass the number of pairs in the whole
mini-batch on all DP ranks (all-reduced SUM) and backward() each micro-batch's loss as is,
exactly like `baton.algos.aggregate`; left None, it is this call's own pair count. A pair's
chosen and rejected rows must sit in the same micro-batch.
"""

from __future__ import annotations

import inspect

import torch
from torch.nn import functional

from baton.algos.logprobs import upcast
from baton.algos.masked import masked_sum
from baton.algos.registry import Registry

DPO_LOSSES = Registry("DPO loss")
register_dpo_loss = DPO_LOSSES.register

Number = int | float | torch.Tensor


def sequence_logprobs(logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Sum of the response tokens' logprobs [B, R] -> [B] (padding garbage stays out)."""
    return masked_sum(logprobs, response_mask, dim=-1)  # [B]


@register_dpo_loss("sigmoid")
def dpo_sigmoid_loss(*, chosen_logratios: torch.Tensor, rejected_logratios: torch.Tensor,
                     beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-pair DPO loss [P]; label_smoothing in [0, 0.5) (the assumed label-flip rate)."""
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    z = beta * (chosen_logratios - rejected_logratios)  # [P]
    return -(1 - label_smoothing) * functional.logsigmoid(z) - label_smoothing * functional.logsigmoid(-z)


@register_dpo_loss("ipo")
def ipo_loss(*, chosen_logratios: torch.Tensor, rejected_logratios: torch.Tensor, beta: float,
             chosen_lengths: torch.Tensor | None = None,
             rejected_lengths: torch.Tensor | None = None,
             length_norm: bool = True) -> torch.Tensor:
    """Per-pair IPO loss [P]; lengths [P] (response tokens) are needed when length_norm."""
    if length_norm:
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError("ipo with length_norm needs chosen_lengths and rejected_lengths")
        chosen_logratios = chosen_logratios / chosen_lengths.clamp(min=1)  # [P]
        rejected_logratios = rejected_logratios / rejected_lengths.clamp(min=1)  # [P]
    h = chosen_logratios - rejected_logratios  # [P]
    return (h - 1 / (2 * beta)) ** 2


@register_dpo_loss("hinge")
def hinge_loss(*, chosen_logratios: torch.Tensor, rejected_logratios: torch.Tensor,
               beta: float) -> torch.Tensor:
    """Per-pair hinge loss [P]: zero once beta h >= 1."""
    return torch.relu(1 - beta * (chosen_logratios - rejected_logratios))


def _mean(x: torch.Tensor) -> torch.Tensor:
    return (x.sum() / max(len(x), 1)).detach()  # 0 (not NaN) for a micro-batch with no pairs


def dpo_loss(name: str = "sigmoid", *, chosen_logps: torch.Tensor, rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor | None = None,
             ref_rejected_logps: torch.Tensor | None = None, beta: float = 0.1,
             reference_free: bool = False, chosen_lengths: torch.Tensor | None = None,
             rejected_lengths: torch.Tensor | None = None, global_pairs: Number | None = None,
             **loss_kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar loss (sum of per-pair losses / global_pairs) and metrics for P pairs.

    chosen_logps, rejected_logps [P]: policy sequence logprobs (with grad); ref_* [P]: the
    frozen reference's (required unless reference_free); *_lengths [P]: response tokens
    (needed by ipo with length_norm). loss_kwargs go to the loss (label_smoothing, length_norm).
    Metrics (means over this call's pairs, detached; as TRL):
        rewards/chosen, rewards/rejected  beta * (log pi - log ref) of each side
        rewards/margins                   their difference
        rewards/accuracies                fraction of pairs with rewards/chosen > rewards/rejected
        logps/chosen, logps/rejected      policy sequence logprobs
        kl                                mean of log pi - log ref over both sides' sequences:
                                          the k1 estimate of KL(pi || ref) per sequence (TRL
                                          online DPO's objective/kl); an estimate only when
                                          the rows were sampled from pi (online), and biased by
                                          best/worst selection. Absent when reference_free.
    """
    if reference_free:
        ref_chosen_logps = torch.zeros_like(chosen_logps)
        ref_rejected_logps = torch.zeros_like(rejected_logps)
    elif ref_chosen_logps is None or ref_rejected_logps is None:
        raise ValueError("dpo_loss needs ref_chosen_logps and ref_rejected_logps "
                         "(or reference_free=True)")
    chosen_lr = upcast(chosen_logps) - upcast(ref_chosen_logps.detach())  # [P] (>= float32)
    rejected_lr = upcast(rejected_logps) - upcast(ref_rejected_logps.detach())  # [P]
    fn = DPO_LOSSES[name]
    lengths = {"chosen_lengths": chosen_lengths, "rejected_lengths": rejected_lengths}
    params = inspect.signature(fn).parameters
    extra = {k: v for k, v in lengths.items() if k in params}
    per_pair = fn(chosen_logratios=chosen_lr, rejected_logratios=rejected_lr, beta=beta,
                  **extra, **loss_kwargs)  # [P]
    n = len(per_pair) if global_pairs is None else global_pairs
    loss = per_pair.sum() / (max(n, 1) if isinstance(n, int) else n)

    r_c, r_r = beta * chosen_lr.detach(), beta * rejected_lr.detach()  # [P] each
    metrics = {"rewards/chosen": _mean(r_c), "rewards/rejected": _mean(r_r),
               "rewards/margins": _mean(r_c - r_r),
               "rewards/accuracies": _mean((r_c > r_r).float()),
               "logps/chosen": _mean(upcast(chosen_logps)),
               "logps/rejected": _mean(upcast(rejected_logps))}
    if not reference_free:
        metrics["kl"] = _mean(torch.cat([chosen_lr, rejected_lr]).detach())
    return loss, metrics
