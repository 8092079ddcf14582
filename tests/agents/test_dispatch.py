"""Episode rows from data-parallel ranks (baton.agents.dispatch): counts merged by hand, and
a rank that dropped every trajectory (an empty batch without fields) skipped in the join."""

import torch

from baton import fields as F
from baton.agents.dispatch import STATS, _collect_episodes, merge_stats
from baton.batch import Batch
from baton.controller.dispatch import Topology


def test_merge_stats_sums_counts_and_weighs_means_by_rows_kept():
    a = {"trajectories": 4, "dropped": {"timeout": 1}, "tool_status": {"ok": 2}, "turns_mean": 2.0,
         "turn_reward_mean": 0.3}
    b = {"trajectories": 4, "dropped": {"timeout": 2, "env": 1}, "tool_status": {"ok": 1, "bad": 1},
         "turns_mean": 5.0, "turn_reward_mean": 0.0}
    out = merge_stats([(a, 3), (b, 1)])  # 3 rows kept on rank 0, 1 on rank 1
    assert out["trajectories"] == 8
    assert out["dropped"] == {"timeout": 3, "env": 1} and out["tool_status"] == {"ok": 3, "bad": 1}
    assert out["turns_mean"] == (2.0 * 3 + 5.0 * 1) / 4  # 2.75
    assert abs(out["turn_reward_mean"] - 0.9 / 4) < 1e-12
    assert merge_stats([({"turns_mean": 0.0}, 0)]) == {"turns_mean": 0.0}  # nothing kept: no division by 0


def test_a_rank_without_rows_is_skipped_and_its_counts_kept():
    rows = Batch.from_dict({F.RESPONSE_IDS: torch.ones(2, 3, dtype=torch.long)},
                           meta={STATS: {"trajectories": 2, "dropped": {}}})
    empty = Batch(meta={STATS: {"trajectories": 2, "dropped": {"timeout": 2}}})
    out = _collect_episodes([rows, empty], Topology(2, (2, 1, 1)))
    assert len(out) == 2 and out.meta[STATS] == {"trajectories": 4, "dropped": {"timeout": 2}}
    assert len(_collect_episodes([empty, empty], Topology(2, (2, 1, 1)))) == 0
