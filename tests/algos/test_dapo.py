"""DAPO: dynamic-sampling group filter and the soft overlong penalty."""

import pytest
import torch

from baton.algos import dynamic_sampling_filter, overlong_penalty


def test_dynamic_sampling_keeps_groups_with_signal():
    # G = 3: [1, 1, 1] all right -> drop; [0, 0, 0] all wrong -> drop; [1, 0, 1] -> keep;
    # [0.5, 0.5, 0.50001] -> keep (exact equality only); [1, nan, 0] (failed reward) -> drop
    scores = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0, 1, 0.5, 0.5, 0.50001, 1, float("nan"), 0])
    keep = dynamic_sampling_filter(scores, group_size=3)
    assert keep.tolist() == [False, False, True, True, False]
    assert keep.repeat_interleave(3).sum().item() == 6  # rows to keep
    with pytest.raises(ValueError):
        dynamic_sampling_filter(scores, group_size=1)
    with pytest.raises(ValueError):
        dynamic_sampling_filter(scores, group_size=4)


def test_overlong_penalty_hand_worked():
    # max_len 20, buffer 4 -> no penalty up to 16 tokens, then linear to -factor at 20:
    #   10 -> 0, 16 -> 0, 17 -> -1/4, 18 -> -2/4, 20 -> -1, 25 (beyond max) -> -1
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    expected = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(lengths, max_len=20, buffer_len=4).tolist() == expected
    # factor 0.5 halves it; lengths from a mask
    mask = torch.tensor([[1] * 18 + [0] * 2, [1] * 20])
    assert overlong_penalty(mask.sum(-1), 20, 4, penalty_factor=0.5).tolist() == [-0.25, -0.5]
    with pytest.raises(ValueError):
        overlong_penalty(lengths, max_len=20, buffer_len=0)
