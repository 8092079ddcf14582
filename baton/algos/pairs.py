"""Preference pairs from scored samples (online DPO), chosen by name from `PAIRINGS`.

Input: scores [B] of G >= 2 samples per prompt, rows prompt-major (G consecutive rows per
prompt, the order of `Batch.repeat(G, interleave=True)`). Output: `PreferencePairs` with
    chosen   [P] long  row index of the preferred sample
    rejected [P] long  row index of the other one (same prompt)
    margin   [P]       score(chosen) - score(rejected), always > `margin` argument
    n_unpaired  int    prompts that produced no pair
Modes:
    best_worst  per prompt, the highest- vs the lowest-scored sample (one pair at most);
                skipped when max - min <= margin (so a group whose scores are all equal
                never pairs; margin 0 by default)
    all         every (i, j) of the prompt with score_i - score_j > margin
Deterministic: best_worst breaks ties by the lowest row index on both sides (of the rows
sharing the max, the first is chosen; of those sharing the min, the first is rejected);
`all` lists pairs by prompt, then chosen row, then rejected row (ascending). A NaN score (a
failed reward) never enters a pair. Pairs are what `baton.algos.dpo` consumes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from baton.algos.registry import Registry

PAIRINGS = Registry("pairing")
register_pairing = PAIRINGS.register


class PreferencePairs(NamedTuple):
    chosen: torch.Tensor  # [P] long
    rejected: torch.Tensor  # [P] long
    margin: torch.Tensor  # [P]
    n_unpaired: int


def _groups(scores: torch.Tensor, group_size: int, margin: float) -> torch.Tensor:
    if margin < 0:  # a negative margin would pair equal scores (and a row with itself)
        raise ValueError(f"margin must be >= 0, got {margin}")
    if group_size < 2:
        raise ValueError(f"pairing needs group_size >= 2, got {group_size}")
    if len(scores) % group_size:
        raise ValueError(f"{len(scores)} rows are not a whole number of groups of {group_size}")
    return scores.float().view(-1, group_size)  # [n_groups, G]


@register_pairing("best_worst")
def best_worst_pairs(scores: torch.Tensor, group_size: int, margin: float = 0.0) -> PreferencePairs:
    g = _groups(scores, group_size, margin)  # [n, G]
    nan = g.isnan()  # [n, G]
    hi = torch.where(nan, -torch.inf, g).amax(-1, keepdim=True)  # [n, 1]
    lo = torch.where(nan, torch.inf, g).amin(-1, keepdim=True)  # [n, 1]
    col = torch.arange(group_size, device=g.device)  # [G]
    first_hi = torch.where(g == hi, col, group_size).amin(-1)  # [n] lowest index among maxima
    first_lo = torch.where(g == lo, col, group_size).amin(-1)  # [n]
    diff = (hi - lo).squeeze(-1)  # [n]; -inf if fewer than one finite score
    keep = diff > margin  # [n]
    base = torch.arange(len(g), device=g.device) * group_size  # [n] first row of each prompt
    return PreferencePairs((base + first_hi)[keep], (base + first_lo)[keep], diff[keep],
                           int((~keep).sum()))


@register_pairing("all")
def all_pairs(scores: torch.Tensor, group_size: int, margin: float = 0.0) -> PreferencePairs:
    g = _groups(scores, group_size, margin)  # [n, G]
    diff = g.unsqueeze(-1) - g.unsqueeze(-2)  # [n, G, G]: diff[n, i, j] = s_i - s_j
    keep = diff > margin  # [n, G, G]; NaN compares False
    prompt, i, j = keep.nonzero(as_tuple=True)  # lexicographic (prompt, i, j)
    base = prompt * group_size
    n_unpaired = int((~keep.flatten(1).any(-1)).sum())
    return PreferencePairs(base + i, base + j, diff[prompt, i, j], n_unpaired)


def preference_pairs(scores: torch.Tensor, group_size: int, mode: str = "best_worst",
                     margin: float = 0.0) -> PreferencePairs:
    """Pairs from scores [B] by `mode` (see the module docstring)."""
    return PAIRINGS[mode](scores, group_size, margin=margin)
