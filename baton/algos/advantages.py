"""Advantage estimators, chosen by name from `ADVANTAGES`.

Every estimator takes keyword-only arguments and returns `(advantages [B, R], returns [B, R])`,
both zero on padding. Data inputs use the field names below; everything else is a
hyper-parameter. Each estimator declares what it reads where it is registered
(`register_advantage(name, inputs=..., hyper=...)`, an `EstimatorNeeds`): its data inputs
(group_index: it compares the samples of a prompt; values: it needs a critic;
baseline_scores: a greedy completion per prompt) and the `algo.*` keys it takes, by keyword.
The config check, the config inventory and the driver read that declaration.
`compute_advantages(name, **kw)` passes each estimator only the data inputs it declares (so
a trainer can hand over everything it has), while a misspelt hyper-parameter still raises
TypeError.

Outcome estimators (grpo, dr_grpo, rloo, reinforce_pp_baseline) read one scalar score per
row and broadcast it over the response; their `returns` equal the advantages (there is no
critic to fit). Groups: rows that share a prompt. Give either `group_index` [B] (any ids,
any order: the rows of one prompt need not be adjacent) or `group_size` G (rows grouped
consecutively, G per prompt, the order of `Batch.repeat(G, interleave=True)`).

Std convention: GRPO divides by the *unbiased* (Bessel, n-1) group std, like verl and TRL
(`torch.std` defaults), so numbers match those implementations; the paper does not say.
For G=2 and rewards [1, 0] this gives +-0.707 (the biased std would give +-1).
A group whose rewards are all equal has std 0 and gets advantage exactly 0 (no NaN): the
centred reward is 0 and eps keeps the division finite. A group of one row gets 0 (no
baseline to compare with); verl instead passes its raw score through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from baton.algos.masked import masked_whiten
from baton.algos.registry import Registry, hyper_args

ADVANTAGES = Registry("advantage estimator")
NEEDS = Registry("advantage estimator's needs")  # name -> EstimatorNeeds, filled by register_advantage

# Data inputs an estimator may read; any other keyword is a hyper-parameter.
# values: critic values [B, R] (gae); baseline_scores: greedy-sample scores [B] (remax);
# old_logprobs, teacher_logprobs: the student's and a teacher's logprobs [B, R] (distill).
ADVANTAGE_INPUTS = ("scores", "response_mask", "group_index", "token_rewards", "values",
                    "baseline_scores", "old_logprobs", "teacher_logprobs")


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an estimator reads, declared where it is registered.

    inputs  the data inputs (ADVANTAGE_INPUTS) it takes
    hyper   its hyper-parameters from the config: keyword -> `algo.<key>` (gae: whiten ->
            whiten_advantages); the driver passes them by name, the config refuses the keys
            no chosen estimator reads
    reward_if  an `algo.<key>` whose non-zero value makes it read the task reward (scores,
            groups); "" = always. distill: task_reward_coef (0 = the teacher alone)
    """
    inputs: tuple[str, ...]
    hyper: dict[str, str] = field(default_factory=dict)
    reward_if: str = ""

    @property
    def groups(self) -> bool:
        """It may compare the samples of a prompt (see `compares_groups` for a given config)."""
        return "group_index" in self.inputs

    def reads_reward(self, algo: Any) -> bool:
        """Whether, with `algo` (an AlgoConfig), it reads the task reward at all."""
        return not self.reward_if or bool(getattr(algo, self.reward_if))

    def compares_groups(self, algo: Any) -> bool:
        """With `algo`, it compares the samples of a prompt: rollout.n >= 2 samples that differ."""
        return self.groups and self.reads_reward(algo)

    @property
    def teacher(self) -> bool:
        """It reads a teacher's logprobs (a `teacher:` section)."""
        return "teacher_logprobs" in self.inputs

    @property
    def critic(self) -> bool:
        """It reads a critic's values."""
        return "values" in self.inputs

    @property
    def baseline(self) -> bool:
        """It reads the score of one greedy completion per prompt (ReMax)."""
        return "baseline_scores" in self.inputs

    def reads(self, key: str) -> bool:
        """Whether it reads `algo.<key>`."""
        return key in self.hyper.values()

    def hyper_args(self, algo: Any) -> dict[str, Any]:
        """Its hyper-parameters' values in `algo` (an AlgoConfig), by keyword."""
        return hyper_args(self.hyper, algo)


def register_advantage(name: str, *, inputs: tuple[str, ...], hyper: dict[str, str] | None = None,
                       reward_if: str = "") -> Callable[[Callable], Callable]:
    """Register an estimator under `name` with what it reads (see `EstimatorNeeds`)."""
    unknown = set(inputs) - set(ADVANTAGE_INPUTS)
    if unknown:
        raise ValueError(f"advantage estimator {name!r}: {sorted(unknown)} are not data inputs {ADVANTAGE_INPUTS}")

    def deco(fn: Callable) -> Callable:
        ADVANTAGES.add(name, fn)
        NEEDS.add(name, EstimatorNeeds(tuple(inputs), dict(hyper or {}), reward_if))
        return fn
    return deco


def estimator_needs(name: str) -> EstimatorNeeds:
    """The declared needs of estimator `name` (UnknownName lists the known ones)."""
    ADVANTAGES[name]  # noqa: B018 -- the estimator's own error for an unknown name
    return NEEDS[name]


def compute_advantages(name: str, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run estimator `name`, dropping the data inputs it does not declare."""
    inputs = estimator_needs(name).inputs
    return ADVANTAGES[name](**{k: v for k, v in kwargs.items() if k not in ADVANTAGE_INPUTS or k in inputs})


# --- groups ----------------------------------------------------------------------------
def group_inverse(n_rows: int, group_index: torch.Tensor | None = None,
                  group_size: int | None = None) -> tuple[torch.Tensor, int]:
    """Map each row to a dense group id 0..n_groups-1. Returns (inverse [B], n_groups)."""
    if (group_index is None) == (group_size is None):
        raise ValueError("give exactly one of group_index and group_size")
    if group_index is not None:
        _, inverse = torch.unique(group_index, return_inverse=True)  # [B]
        return inverse, int(inverse.max()) + 1 if n_rows else 0
    if n_rows % group_size:
        raise ValueError(f"{n_rows} rows are not a whole number of groups of {group_size}")
    return torch.arange(n_rows) // group_size, n_rows // group_size  # [B]


def group_stats(scores: torch.Tensor, inverse: torch.Tensor, n_groups: int,
                unbiased: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (group mean, group std, group size), each [B]."""
    scores = scores.float() if not scores.is_floating_point() else scores
    inverse = inverse.to(scores.device)
    zeros = scores.new_zeros(n_groups)
    count = zeros.index_add(0, inverse, torch.ones_like(scores))  # [n_groups]
    mean = zeros.index_add(0, inverse, scores) / count  # [n_groups]
    sq_dev = zeros.index_add(0, inverse, (scores - mean[inverse]) ** 2)  # [n_groups]
    denom = (count - 1).clamp(min=1) if unbiased else count  # singleton: var 0, not 0/0
    std = (sq_dev / denom).sqrt()  # [n_groups]
    return mean[inverse], std[inverse], count[inverse]  # [B] each


def _broadcast(per_row: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_row.unsqueeze(-1) * response_mask.to(per_row.dtype)  # [B, R]


# --- outcome estimators ---------------------------------------------------------------
@register_advantage("grpo", inputs=("scores", "response_mask", "group_index"))
def grpo_advantages(*, scores: torch.Tensor, response_mask: torch.Tensor,
                    group_index: torch.Tensor | None = None, group_size: int | None = None,
                    norm_by_std: bool = True, eps: float = 1e-6, unbiased_std: bool = True):
    """GRPO (Shao et al. 2024): A_i = (r_i - mean_group) / (std_group + eps) on every token.

    scores [B], response_mask [B, R]. `norm_by_std=False` is Dr. GRPO (Liu et al. 2025),
    which drops the std division because it up-weights near-uniform groups.
    """
    inverse, n_groups = group_inverse(len(scores), group_index, group_size)
    mean, std, _ = group_stats(scores, inverse, n_groups, unbiased=unbiased_std)  # [B] each
    adv = scores - mean  # [B]
    if norm_by_std:
        adv = adv / (std + eps)  # [B]
    adv = _broadcast(adv, response_mask)  # [B, R]
    return adv, adv


@register_advantage("dr_grpo", inputs=("scores", "response_mask", "group_index"))
def dr_grpo_advantages(*, scores, response_mask, group_index=None, group_size=None):
    """Dr. GRPO: group-mean baseline only, no std scaling (pair with seq-mean-token-sum-norm)."""
    return grpo_advantages(scores=scores, response_mask=response_mask, group_index=group_index,
                           group_size=group_size, norm_by_std=False)


@register_advantage("rloo", inputs=("scores", "response_mask", "group_index"))
def rloo_advantages(*, scores: torch.Tensor, response_mask: torch.Tensor,
                    group_index: torch.Tensor | None = None, group_size: int | None = None):
    """RLOO (Ahmadian et al. 2024): A_i = r_i - mean of the *other* rows of the group.

    Computed as n/(n-1) * (r_i - mean), which is the same number. Singleton groups get 0.
    """
    inverse, n_groups = group_inverse(len(scores), group_index, group_size)
    mean, _, count = group_stats(scores, inverse, n_groups)  # [B] each
    scale = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.zeros_like(count))
    adv = _broadcast((scores - mean) * scale, response_mask)  # [B, R]
    return adv, adv


@register_advantage("remax", inputs=("scores", "response_mask", "baseline_scores"))
def remax_advantages(*, scores: torch.Tensor, baseline_scores: torch.Tensor,
                     response_mask: torch.Tensor):
    """ReMax (Li et al. 2024): A_i = r_i - r(greedy response to the same prompt), on every
    token. scores, baseline_scores [B] (the rollout scores one greedy sample per prompt and
    repeats its score on that prompt's rows). No whitening, as in the paper and verl.
    """
    diff = scores - baseline_scores  # [B]
    adv = _broadcast(diff if diff.is_floating_point() else diff.float(), response_mask)  # [B, R]
    return adv, adv


@register_advantage("reinforce_pp_baseline", inputs=("scores", "response_mask", "group_index"))
def reinforce_pp_baseline_advantages(*, scores: torch.Tensor, response_mask: torch.Tensor,
                                     group_index: torch.Tensor | None = None,
                                     group_size: int | None = None, eps: float = 1e-8):
    """REINFORCE++-baseline (Hu et al. 2025): subtract the group mean, then whiten over
    all response tokens of the batch (batch-level, not group-level, normalisation).
    """
    inverse, n_groups = group_inverse(len(scores), group_index, group_size)
    mean, _, _ = group_stats(scores, inverse, n_groups)  # [B]
    centred = _broadcast(scores - mean, response_mask)  # [B, R]
    adv = masked_whiten(centred, response_mask, eps=eps)  # [B, R]
    return adv, adv


# --- token-level estimators -----------------------------------------------------------
def discounted_returns(token_rewards: torch.Tensor, response_mask: torch.Tensor,
                       gamma: float = 1.0) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over the masked tokens, computed in float32 at least.

    A hole in the mask (observation / tool-output tokens inside a multi-turn response) is
    *skipped*: it is not a step (no discount), its reward is ignored, and G runs on across
    it, so every turn sees the outcome reward that lands after the last turn. E.g. gamma 0.5,
    mask [1, 1, 0, 0, 1], reward 1 on the last token -> G = [0.25, 0.5, 0, 0, 1].
    This is how verl's GAE treats observation tokens. Departures: verl's reinforce_plus_plus
    *resets* G to 0 at every masked position (right for trailing padding, but it cuts the
    earlier turns off from the outcome: G = [0, 0, 0, 0, 1] above); OpenRLHF counts the hole
    as steps of reward 0 (G = [0.0625, 0.125, ...]: extra discount; the same when gamma = 1).
    """
    mask = response_mask.bool()  # [B, R]
    token_rewards = token_rewards.detach()
    if token_rewards.dtype in (torch.float16, torch.bfloat16):  # a long recursion in bf16 drifts
        token_rewards = token_rewards.float()
    ret = torch.zeros_like(token_rewards)  # [B, R]
    running = token_rewards.new_zeros(token_rewards.shape[0])  # [B]
    for t in reversed(range(token_rewards.shape[1])):
        # `where`, not arithmetic with the mask, so garbage in padding cannot leak in as NaN
        running = torch.where(mask[:, t], token_rewards[:, t] + gamma * running, running)  # [B]
        ret[:, t] = torch.where(mask[:, t], running, 0.0)
    return ret


@register_advantage("reinforce_pp", inputs=("token_rewards", "response_mask"), hyper={"gamma": "gamma"})
def reinforce_pp_advantages(*, token_rewards: torch.Tensor, response_mask: torch.Tensor,
                            gamma: float = 1.0, eps: float = 1e-8):
    """REINFORCE++ (Hu et al. 2025): discounted return-to-go of the token rewards (the KL
    penalty is expected to be folded into them already), whitened over the batch.
    Returns (whitened advantages, raw returns)."""
    returns = discounted_returns(token_rewards, response_mask, gamma)  # [B, R]
    return masked_whiten(returns, response_mask, eps=eps), returns


@register_advantage("gae", inputs=("token_rewards", "values", "response_mask"),
                    hyper={"gamma": "gamma", "lam": "lam", "whiten": "whiten_advantages"})
def gae_advantages(*, token_rewards: torch.Tensor, values: torch.Tensor,
                   response_mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0,
                   whiten: bool = True):
    """GAE (Schulman et al. 2016) for PPO: A_t = sum_k (gamma lam)^k delta_{t+k},
    delta_t = r_t + gamma V_{t+1} - V_t, with V = 0 after the last response token.

    token_rewards, values, response_mask [B, R]. Returns (advantages, returns = A + V before
    whitening: the critic's targets), both zero on padding. Positions outside the mask
    neither receive nor pass on value: a hole (tool output) is skipped, not terminal, so
    delta_t of the token before it bootstraps from the first real token after it (verl's
    treatment of observation tokens), and rewards/values there are ignored, even garbage.
    `whiten` (default, as verl / OpenRLHF) normalises the advantages over the batch's real
    tokens (mean 0, unbiased std 1); the returns are never whitened.
    Computed without gradient (values from a critic forward pass must not leak into the
    critic's targets) and in float32 at least (a bf16 critic's values would otherwise
    accumulate rounding over R steps). OpenRLHF departs: it zeroes masked values/rewards and
    keeps them in the recursion (a hole then acts as V = 0 steps).
    """
    mask = response_mask.bool()  # [B, R]
    token_rewards, values = token_rewards.detach(), values.detach()
    if values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()
    adv = torch.zeros_like(values)  # [B, R]
    next_value = values.new_zeros(values.shape[0])  # [B]
    next_adv = values.new_zeros(values.shape[0])  # [B]
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]  # [B]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        gae = delta + gamma * lam * next_adv  # [B]
        # `where` so that a masked position passes the later value/advantage through untouched
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, gae, next_adv)
        adv[:, t] = torch.where(m, gae, 0.0)
    returns = torch.where(mask, adv + values, 0.0)  # [B, R]
    if whiten:
        adv = masked_whiten(adv, response_mask)
    return adv, returns
