"""The NLL term of RPO (Pang et al. 2024, "Iterative Reasoning Preference Optimization"):
DPO plus the negative log-likelihood of the chosen response, per token.

    loss = dpo_loss + alpha * sum_pairs ( -log pi(y_c) / |y_c| ) / global_pairs

Why: DPO only widens the gap between chosen and rejected, and on short, similar answers
(a wrong sum shares digits with the right one) it tends to lower both, the chosen one too
("likelihood displacement"); on math tasks Pang et al. find DPO alone does not raise
accuracy and the NLL term does. TRL calls alpha `rpo_alpha`; the per-token mean is theirs
(and the paper's, eq. 4, |c| + |y| tokens normalise the NLL; here only the response is a
target, so |y_c|). Same normaliser convention as `baton.algos.dpo_loss`.
"""

from __future__ import annotations

import torch

from baton.algos.logprobs import upcast

Number = int | float | torch.Tensor


def chosen_nll(chosen_logps: torch.Tensor, chosen_lengths: torch.Tensor,
               global_pairs: Number | None = None) -> torch.Tensor:
    """sum over pairs of -log pi(y_c) / |y_c|, divided by global_pairs (default: this
    call's pairs). chosen_logps [P]: sequence logprobs (sums over tokens); chosen_lengths [P]."""
    per_pair = -upcast(chosen_logps) / chosen_lengths.float().clamp(min=1)  # [P]
    n = len(per_pair) if global_pairs is None else global_pairs
    return per_pair.sum() / (max(n, 1) if isinstance(n, int) else n)
