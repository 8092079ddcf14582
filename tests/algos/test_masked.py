"""Masked reductions: hand-worked numbers, padding garbage stays out, empty masks give 0."""

import math

import torch

from baton.algos import masked_mean, masked_sum, masked_var, masked_whiten

X = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 5.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 1]])  # real entries 1, 2, 3, 5


def test_masked_sum_and_mean_ignore_padding_garbage():
    assert masked_sum(X, M).item() == 11.0  # 1 + 2 + 3 + 5
    assert masked_mean(X, M).item() == 2.75  # 11 / 4
    assert torch.equal(masked_mean(X, M, dim=-1), torch.tensor([1.5, 4.0]))  # (1+2)/2, (3+5)/2


def test_masked_mean_of_empty_mask_is_zero():
    assert masked_mean(X, torch.zeros_like(M)).item() == 0.0
    assert torch.equal(masked_mean(X, torch.tensor([[0, 0, 0], [1, 0, 0]]), dim=-1),
                       torch.tensor([0.0, 3.0]))


def test_masked_var_unbiased_and_biased():
    # entries 1, 2, 3, 5: mean 2.75, squared deviations 3.0625 + 0.5625 + 0.0625 + 5.0625 = 8.75
    assert math.isclose(masked_var(X, M).item(), 8.75 / 3, rel_tol=1e-6)
    assert math.isclose(masked_var(X, M, unbiased=False).item(), 8.75 / 4, rel_tol=1e-6)


def test_masked_whiten():
    w = masked_whiten(X, M, eps=0.0)
    std = math.sqrt(8.75 / 3)
    expected = torch.tensor([[(1 - 2.75) / std, (2 - 2.75) / std, 0.0],
                             [(3 - 2.75) / std, 0.0, (5 - 2.75) / std]])
    torch.testing.assert_close(w, expected)
    # scale-only: mean added back
    w2 = masked_whiten(X, M, shift_mean=False, eps=0.0)
    torch.testing.assert_close(w2, torch.where(M.bool(), expected + 2.75, 0.0))
