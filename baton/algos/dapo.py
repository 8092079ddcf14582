"""DAPO's two data-side pieces (Yu et al. 2025); its loss side is `ppo_clip` with
clip_high > clip_low and the "token-mean" aggregation.

    dynamic_sampling_filter   which prompt groups carry a learning signal (non-identical
                              rewards); the trainer keeps those and samples more prompts
                              until the batch is full
    overlong_penalty          soft length penalty over the last `buffer_len` tokens before
                              max_new_tokens, added to the sequence reward

Rows are prompt-major: G consecutive rows per prompt (`Batch.repeat(G, interleave=True)`).
"""

from __future__ import annotations

import torch


def dynamic_sampling_filter(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Keep-mask [n_groups] (bool): True where the group's scores are not all equal.

    scores [B] with B = n_groups * group_size. A group whose G rewards are identical (all
    right or all wrong) has zero GRPO advantage everywhere and only dilutes the batch. Equality
    is exact (max == min). A group containing a NaN score (a failed reward) is dropped.
    Rows to keep: `keep.repeat_interleave(group_size)` [B].
    Departure from verl: group_size 1 raises instead of keeping every singleton group (there
    is no variance to filter on, and a sampling loop waiting for "non-identical" would spin).
    """
    if group_size < 2:
        raise ValueError(f"dynamic sampling needs group_size >= 2, got {group_size}")
    if len(scores) % group_size:
        raise ValueError(f"{len(scores)} rows are not a whole number of groups of {group_size}")
    groups = scores.float().view(-1, group_size)  # [n_groups, G]
    spread = groups.amax(-1) - groups.amin(-1)  # [n_groups]; NaN if any score is NaN
    return spread > 0


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int,
                     penalty_factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment R_length [B] (<= 0), to be added to the scores.

    lengths [B] = real response tokens (`response_mask.sum(-1)`), max_len = max_new_tokens,
    buffer_len = L_cache. With L = |y| and start = max_len - buffer_len:
        0                                  if L <= start
        -(L - start) / buffer_len * factor if start < L <= max_len   (linear, -factor at max)
        -factor                            if L > max_len
    (paper eq. 13 with a `penalty_factor`, as in verl; verl omits the clamp at max_len,
    which generation never exceeds).
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got {buffer_len}, {max_len}")
    exceed = (lengths.float() - (max_len - buffer_len)).clamp(0, buffer_len)  # [B]
    return -exceed / buffer_len * penalty_factor  # [B]
