"""The RPO NLL term: per-token NLL of the chosen responses, over a global pair count."""

import pytest
import torch

from baton.algos.rpo import chosen_nll


def test_chosen_nll_hand_worked():
    # pair 0: logp -3 over 3 tokens -> 1.0 per token; pair 1: -1 over 2 tokens -> 0.5
    logps = torch.tensor([-3.0, -1.0], requires_grad=True)
    loss = chosen_nll(logps, torch.tensor([3, 2]))
    assert loss.item() == pytest.approx((1.0 + 0.5) / 2)
    loss.backward()  # d/d logp_i = -1 / (|y_i| P)
    assert logps.grad.tolist() == pytest.approx([-1 / 6, -1 / 4])
    # the same two pairs as a share of 4 pairs on all ranks: sum / 4
    assert chosen_nll(logps.detach(), torch.tensor([3, 2]), global_pairs=4).item() == pytest.approx(1.5 / 4)
    # an empty response counts as one token (no division by zero)
    assert chosen_nll(torch.tensor([-2.0]), torch.tensor([0])).item() == pytest.approx(2.0)
