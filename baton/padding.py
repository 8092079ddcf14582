"""Token lists to padded tensors, and position ids from an attention mask.

baton's one convention, shared by the rollout engine and every trainer: prompts are
left-padded (their last tokens line up, so generation appends at one column), responses and
SFT examples right-padded, and a token's position id is the number of real tokens before it
(`cumsum(attention_mask) - 1`, 0 on left padding).
"""

from __future__ import annotations

from typing import Sequence

import torch


def pad_left(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids [B, W] (long) and attention mask [B, W] (long); W = the longest."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [B, W]
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # [B, W]
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s):] = torch.as_tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def pad_right(seqs: Sequence[Sequence], pad: float | int, dtype: torch.dtype = torch.long,
              width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded values [B, W] of `dtype` and mask [B, W] (long); W = `width` or the
    longest (at least 1)."""
    width = width or max(1, max(len(s) for s in seqs))
    out = torch.full((len(seqs), width), pad, dtype=dtype)  # [B, W]
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # [B, W]
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.as_tensor(s, dtype=dtype)
        mask[i, :len(s)] = 1
    return out, mask


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Position ids [..., T] (long) of the tokens under an attention mask [..., T] (any dtype):
    real tokens count 0, 1, 2, ... from the first one; left padding gets 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


__all__ = ["pad_left", "pad_right", "position_ids"]
