"""The update's rows reordered so that every data-parallel rank carries the same work at
every gradient all-reduce.

The controller cuts an update's batch into dp contiguous chunks (DP_COMPUTE); each rank
then shuffles its own prompt groups with the step's seed (`ActorWorker._group_shuffled`:
with equal group counts, the same permutation on every rank) and cuts them into
mini-batches, one gradient all-reduce each, where every rank waits for the slowest. So
what must be equal is not only each rank's total but each mini-batch's.

`balanced_for_ranks` sorts the prompt groups by what the update computes for them (the
prompt once, every response token), deals them out in rounds of dp (the dp most alike in
one round) to the same local position on every rank, in snake order (rank 0 takes the
costliest group of even rounds and the cheapest of odd ones, so the totals even out too).
Whatever the shuffle then draws, mini-batch j of every rank holds groups of alike cost.
(verl's `balance_batch` evens out the ranks' totals only.) One rank, a batch that the ranks
cannot share evenly, or groups of unequal sizes: the batch is returned as it is.
"""

from __future__ import annotations

import torch

from baton import fields as F
from baton.batch import Batch
from baton.workers.sequences import prompt_groups


def group_costs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(first row of each prompt group [U], group of each row [B], tokens the update computes
    for each group [U]: its prompt once plus all its response tokens)."""
    first, run = prompt_groups(batch)
    responses = torch.zeros(len(first), dtype=torch.float64).index_add_(
        0, run, batch[F.RESPONSE_MASK].sum(1).double())
    return first, run, batch[F.PROMPT_MASK][first].sum(1).double() + responses


def balanced_for_ranks(batch: Batch, dp: int) -> Batch:
    """The batch's rows reordered so that rank r's chunk (of dp contiguous ones) holds, at
    each local position, a group as costly as the other ranks' (see the module's docstring)."""
    if dp <= 1 or len(batch) % dp:
        return batch
    first, run, cost = group_costs(batch)
    sizes = torch.bincount(run)  # [U]
    if len(first) % dp or (sizes != sizes[0]).any():
        return batch
    order = torch.argsort(cost, descending=True, stable=True)  # [U]
    rounds = order.view(-1, dp).clone()  # [U / dp, dp]: round i, the dp groups most alike
    rounds[1::2] = rounds[1::2].flip(1)  # snake: odd rounds dealt from the last rank
    per_rank = rounds.t().reshape(-1)  # rank 0's groups by position, then rank 1's, ...
    rows = first[per_rank][:, None] + torch.arange(int(sizes[0]))  # [U, G]
    return batch.rows(rows.reshape(-1))
