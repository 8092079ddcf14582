"""On-policy distillation: the `distill` advantage estimator and its metrics.

The student samples, a frozen teacher scores every sampled token, and the per-token reverse
KL is the learning signal (GKD, Agarwal et al. 2024; Thinking Machines' "On-Policy
Distillation" and the Tinker cookbook, whose shape this follows):

    A_t = -(log pi_s(x_t) - log pi_t(x_t))  +  c * (r - mean_group r)       on policy tokens
        = log pi_t(x_t) - log pi_s(x_t)       (c = algo.task_reward_coef = 0: pure distillation)

with discount 0: each token is credited only with its own log-ratio (no return-to-go), so the
signal is dense and exact per token, and the policy-gradient step with this advantage is the
gradient of the sampled reverse KL, KL(pi_s || pi_t) = E_{x ~ pi_s}[log pi_s - log pi_t].
The task term (optional) is Dr. GRPO's group-centred reward on every token of the row, as the
cookbook mixes it; it needs groups (rollout.n >= 2). No whitening: the log-ratio has a scale
of its own (nats), which whitening would throw away.

`old_logprobs` are the student's logprobs at the step's start (the engine's behaviour
logprobs, or the trainer's recomputed proximal ones with an off-policy correction: either way
the policy the step moves away from), `teacher_logprobs` the teacher's of the same tokens at
the same temperature. Observation tokens of agent rows (mask 0) get 0.

`distill_metrics` says how far the student is from the teacher on its own samples:
    distill/reverse_kl        mean over policy tokens of log pi_s - log pi_t (the k1 estimate)
    distill/teacher_logprob   mean teacher logprob of the student's tokens
    distill/teacher_below     fraction of tokens the teacher finds at least 2x less likely
                              than the student does (log pi_t < log pi_s - log 2): a stand-in
                              for "the teacher disagrees", since the teacher's full logits are
                              not kept (logprobs come from the fused head, no [V] row per token)

`algo.distill_loss`: an entry of `DISTILL_LOSSES`, each declaring what it reads (`DistillLoss`:
its `algo.*` keys by keyword, and whether the teacher keeps its top-k tokens). "advantage"
(the default) is the sampled form above; the others are GKD's full-distribution losses:
the teacher keeps its K most likely tokens at every response position (`algo.distill_topk`, 0 =
the whole vocabulary), the actor computes the student's logprobs of the same K tokens, and the
divergence between the two distributions, summed over the K tokens (both renormalised over
them: exact with the whole vocabulary), is a loss term of every policy token, beside the policy
loss. It replaces the sampled token's one-sample estimate by the exact per-position divergence:
no sampling noise, so larger steps stay stable. The advantage then holds only the task term
(0 without algo.task_reward_coef):

    reverse_kl   sum_v p_s(v) (log p_s(v) - log p_t(v))             KL(student || teacher), mode-seeking
    forward_kl   sum_v p_t(v) (log p_t(v) - log p_s(v))             KL(teacher || student), mass-covering
    jsd          beta KL(p_t || m) + (1 - beta) KL(p_s || m),  m = beta p_t + (1 - beta) p_s
                 (GKD's generalised JSD as TRL writes it; beta = algo.distill_beta in (0, 1))

The student's K logprobs carry the gradient; the teacher's are constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from baton.algos.advantages import dr_grpo_advantages, register_advantage
from baton.algos.masked import masked_mean
from baton.algos.registry import Registry

DISTILL_LOSSES = Registry("distillation loss")  # name -> DistillLoss


@dataclass(frozen=True)
class DistillLoss:
    """A form of distillation and what it reads, declared where it is registered.

    divergence  [B, R] of student, teacher [B, R, K] logprobs over the teacher's top-k tokens
                (`algo.distill_topk`), a loss term of every policy token beside the policy loss;
                None: the sampled form, the sampled token's log ratio as the advantage
    hyper       keyword -> `algo.<key>` it is given (jsd: beta -> distill_beta)
    """
    divergence: Callable[..., torch.Tensor] | None = None
    hyper: dict[str, str] = field(default_factory=dict)

    @property
    def sampled(self) -> bool:
        """The sampled token's log ratio is the advantage (no loss term, no top-k)."""
        return self.divergence is None

    @property
    def keys(self) -> tuple[str, ...]:
        """The `algo.*` keys it reads: its hyper-parameters, and distill_topk unless sampled."""
        return (*self.hyper.values(), *(() if self.sampled else ("distill_topk",)))

    def topk(self, algo: Any) -> int | None:
        """The teacher's tokens kept per position (0: all); None: the sampled tokens' only."""
        return None if self.sampled else algo.distill_topk

    def __call__(self, *, student: torch.Tensor, teacher: torch.Tensor, **hyper: Any) -> torch.Tensor:
        return self.divergence(student=student, teacher=teacher, **hyper)

    def terms(self, student: torch.Tensor, teacher: torch.Tensor, algo: Any) -> torch.Tensor:
        """[B, R]: the divergence of student, teacher [B, R, K], with its declared algo.* keys."""
        return self(student=student, teacher=teacher, **{kw: getattr(algo, key) for kw, key in self.hyper.items()})


def register_distill_loss(name: str, hyper: dict[str, str] | None = None) -> Callable[[Callable], Callable]:
    """Decorator: a divergence over the teacher's top-k tokens as distillation loss `name`,
    with the `algo.*` keys it is given (`hyper`: keyword -> key)."""
    def deco(fn: Callable) -> Callable:
        DISTILL_LOSSES.add(name, DistillLoss(fn, dict(hyper or {})))
        return fn
    return deco


def divergences() -> list[str]:
    """The distillation losses that are a divergence over the teacher's top-k tokens."""
    return [name for name, form in DISTILL_LOSSES.items() if not form.sampled]


DISTILL_LOSSES.add("advantage", DistillLoss())  # algo.distill_loss's default: the sampled form

DISAGREE_MARGIN = math.log(2.0)  # teacher_below: the teacher gives the token < half the student's probability


@register_advantage("distill", inputs=("old_logprobs", "teacher_logprobs", "response_mask", "scores", "group_index"),
                    hyper={"task_reward_coef": "task_reward_coef", "distill_loss": "distill_loss"},
                    reward_if="task_reward_coef")
def distill_advantages(*, old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, response_mask: torch.Tensor,
                       scores: torch.Tensor | None = None, group_index: torch.Tensor | None = None,
                       group_size: int | None = None, task_reward_coef: float = 0.0, distill_loss: str = "advantage"):
    """See the module docstring. old_logprobs, teacher_logprobs, response_mask [B, R];
    scores [B] and groups only with task_reward_coef != 0. Returns (advantages, returns),
    equal, 0 off the mask. distill_loss other than "advantage": the teacher's signal is the
    actor's loss term (`DISTILL_LOSSES`), the advantage only the task term."""
    mask = response_mask.bool()  # [B, R]
    gap = teacher_logprobs.detach().float() - old_logprobs.detach().float()  # [B, R] -(log s - log t)
    if not DISTILL_LOSSES[distill_loss].sampled:
        gap = torch.zeros_like(gap)
    adv = torch.where(mask, gap, 0.0)  # `where`: whatever sits on padding / observations stays out
    if task_reward_coef:
        task, _ = dr_grpo_advantages(scores=scores.float(), response_mask=response_mask,
                                     group_index=group_index, group_size=group_size)  # [B, R]
        adv = adv + task_reward_coef * task
    return adv, adv


def distill_metrics(old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                    response_mask: torch.Tensor) -> dict[str, float]:
    """The step's distill/* metrics (module docstring), means over the policy tokens."""
    student, teacher = old_logprobs.float(), teacher_logprobs.float()  # [B, R] each
    below = (teacher < student - DISAGREE_MARGIN).float()  # [B, R]
    return {"distill/reverse_kl": masked_mean(student - teacher, response_mask).item(),
            "distill/teacher_logprob": masked_mean(teacher, response_mask).item(),
            "distill/teacher_below": masked_mean(below, response_mask).item()}


def _renormalised(logprobs: torch.Tensor) -> torch.Tensor:
    """[B, R, K] logprobs of K tokens as a distribution over those K (a no-op over the whole
    vocabulary, up to rounding)."""
    return logprobs - torch.logsumexp(logprobs, dim=-1, keepdim=True)


@register_distill_loss("reverse_kl")
def reverse_kl_loss(*, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """[B, R]: KL(p_s || p_t) over the K tokens; student, teacher [B, R, K] logprobs."""
    s, t = _renormalised(student.float()), _renormalised(teacher.detach().float())
    return (s.exp() * (s - t)).sum(-1)


@register_distill_loss("forward_kl")
def forward_kl_loss(*, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """[B, R]: KL(p_t || p_s) over the K tokens (cross-entropy to the teacher, less its entropy)."""
    s, t = _renormalised(student.float()), _renormalised(teacher.detach().float())
    return (t.exp() * (t - s)).sum(-1)


@register_distill_loss("jsd", hyper={"beta": "distill_beta"})
def jsd_loss(*, student: torch.Tensor, teacher: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """[B, R]: beta KL(p_t || m) + (1 - beta) KL(p_s || m), m = beta p_t + (1 - beta) p_s."""
    if not 0 < beta < 1:
        raise ValueError(f"jsd needs beta in (0, 1), got {beta} (forward_kl / reverse_kl are the ends)")
    s, t = _renormalised(student.float()), _renormalised(teacher.detach().float())
    m = torch.logsumexp(torch.stack([t + math.log(beta), s + math.log(1 - beta)]), dim=0)  # [B, R, K]
    return beta * (t.exp() * (t - m)).sum(-1) + (1 - beta) * (s.exp() * (s - m)).sum(-1)
