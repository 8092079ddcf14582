"""Preference pairs from scored groups: best_worst and all, ties, margins, NaN scores."""

import pytest
import torch

from baton.algos import PAIRINGS, preference_pairs

# G = 3, prompt-major: rows 0-2 | 3-5 | 6-8 | 9-11
SCORES = torch.tensor([0.2, 0.9, 0.9, 1, 1, 1, 0.5, float("nan"), 0.1, 0, 1, 0.5])


def check(p, chosen, rejected, margin, n_unpaired):
    assert p.chosen.tolist() == chosen and p.rejected.tolist() == rejected
    assert p.chosen.dtype == p.rejected.dtype == torch.long
    torch.testing.assert_close(p.margin, torch.tensor(margin))
    assert p.n_unpaired == n_unpaired


def test_best_worst():
    # prompt 0: max 0.9 on rows 1 and 2 -> the first, row 1; min 0.2 row 0; margin 0.7
    # prompt 1: all equal -> no pair; prompt 2: NaN row 7 ignored: 0.5 (row 6) vs 0.1 (row 8)
    # prompt 3: 1 (row 10) vs 0 (row 9)
    check(preference_pairs(SCORES, 3), [1, 6, 10], [0, 8, 9], [0.7, 0.4, 1.0], 1)
    # minimum margin 0.5 (strict): prompt 2's 0.4 is dropped too
    check(preference_pairs(SCORES, 3, margin=0.5), [1, 10], [0, 9], [0.7, 1.0], 2)
    # ties on the low side also go to the first row: [0, 1, 0] -> rejected row 0
    check(preference_pairs(torch.tensor([0.0, 1, 0]), 3), [1], [0], [1.0], 0)
    # one finite score, or none: no pair
    check(preference_pairs(torch.tensor([float("nan"), 1.0, float("nan"), float("nan")]), 2),
          [], [], [], 2)


def test_all_pairs():
    # every (i, j) with s_i - s_j > 0, ordered by prompt, chosen row, rejected row:
    #   prompt 0: (1, 0) 0.7, (2, 0) 0.7 (rows 1 and 2 tie: no pair between them)
    #   prompt 1: none; prompt 2: (6, 8) 0.4 (NaN never pairs)
    #   prompt 3: (10, 9) 1, (10, 11) 0.5, (11, 9) 0.5
    check(preference_pairs(SCORES, 3, "all"), [1, 2, 6, 10, 10, 11], [0, 0, 8, 9, 11, 9],
          [0.7, 0.7, 0.4, 1.0, 0.5, 0.5], 1)
    # margin 0.5 (strict): the 0.4 and both 0.5 pairs go; prompt 2 is now unpaired
    check(PAIRINGS["all"](SCORES, 3, margin=0.5), [1, 2, 10], [0, 0, 9], [0.7, 0.7, 1.0], 2)


def test_pairing_rejects_bad_arguments():
    with pytest.raises(ValueError):
        preference_pairs(SCORES, 1)
    with pytest.raises(ValueError):
        preference_pairs(SCORES, 5)
    with pytest.raises(ValueError):
        preference_pairs(SCORES, 3, margin=-0.1)
    with pytest.raises(KeyError, match="known"):
        preference_pairs(SCORES, 3, "best-worst")
