"""Prompt groups dealt to data-parallel ranks by cost (baton.trainers.rank_balance), by hand."""

from __future__ import annotations

import torch

from baton import fields as F
from baton.batch import Batch
from baton.trainers.rank_balance import balanced_for_ranks, group_costs


def batch_of(lengths: list[list[int]], prompt_len: int = 1) -> Batch:
    """One group per entry (its rows' response lengths); group g's prompt is [g + 10] * prompt_len."""
    rows = [(g, n) for g, group in enumerate(lengths) for n in group]
    R = max(n for _, n in rows)
    return Batch({F.PROMPT_IDS: torch.tensor([[g + 10] * prompt_len for g, _ in rows]),
                  F.PROMPT_MASK: torch.ones(len(rows), prompt_len, dtype=torch.long),
                  F.RESPONSE_IDS: torch.tensor([[g] * R for g, _ in rows]),
                  F.RESPONSE_MASK: torch.tensor([[1] * n + [0] * (R - n) for _, n in rows])})


def groups_of(batch: Batch) -> list[int]:
    return batch[F.RESPONSE_IDS][:, 0].tolist()


def test_groups_dealt_in_rounds_of_alike_cost_snake_order():
    # groups A..D (2 rows each, 1 prompt token): costs 1 + 1 + 1 = 3, 1 + 2 + 2 = 5, 7, 9
    b = batch_of([[1, 1], [2, 2], [3, 3], [4, 4]])
    assert group_costs(b)[2].tolist() == [3.0, 5.0, 7.0, 9.0]
    # contiguous halves would be A+B = 8 vs C+D = 16. By cost: D 9, C 7, B 5, A 3; round 0
    # deals D, C to ranks 0, 1; round 1 (snake) deals B, A to ranks 1, 0:
    # rank 0 = D, A (12), rank 1 = C, B (12); position 0: 9 vs 7, position 1: 3 vs 5
    out = balanced_for_ranks(b, 2)
    assert groups_of(out) == [3, 3, 0, 0, 2, 2, 1, 1]
    assert torch.equal(out[F.RESPONSE_MASK].sum(1), torch.tensor([4, 4, 1, 1, 3, 3, 2, 2]))


def test_prompt_counted_once_per_group():
    # prompts of 3 tokens, computed once per group: 3 + (1 + 1) = 5 and 3 + (2 + 2) = 7
    # (not 2 x 3 + ...: the update shares a group's prompt forward among its rows)
    b = batch_of([[1, 1], [2, 2]], prompt_len=3)
    assert group_costs(b)[2].tolist() == [5.0, 7.0]


def test_left_as_it_is_when_it_cannot_be_dealt_evenly():
    b = batch_of([[1, 1], [2, 2], [3, 3], [4, 4]])
    assert balanced_for_ranks(b, 1) is b  # one rank: nothing to balance
    assert balanced_for_ranks(b, 3) is b  # 8 rows over 3 ranks: the dispatch pads
    odd = batch_of([[1, 1], [2, 2], [3, 3]])
    assert balanced_for_ranks(odd, 2) is odd  # 3 groups over 2 ranks
    uneven = batch_of([[1, 1, 1], [2], [3, 3], [4, 4]])
    assert balanced_for_ranks(uneven, 2) is uneven  # groups of unequal sizes


def test_every_row_kept_once():
    g = torch.Generator().manual_seed(0)
    lengths = [[int(x) for x in torch.randint(1, 9, (4,), generator=g)] for _ in range(8)]
    b = batch_of(lengths)
    out = balanced_for_ranks(b, 4)
    key = lambda bb: sorted(zip(groups_of(bb), bb[F.RESPONSE_MASK].sum(1).tolist()))  # noqa: E731
    assert key(out) == key(b)
    costs = group_costs(out)[2].view(4, 2)  # [rank, position]: 8 groups, 2 per rank
    ranked = group_costs(b)[2].sort(descending=True).values.view(2, 4)  # the rounds, costliest first
    for position in range(2):  # each position across the ranks holds one round's groups
        assert sorted(costs[:, position].tolist()) == sorted(ranked[position].tolist())
