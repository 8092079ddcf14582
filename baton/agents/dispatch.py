"""How episode rows come back from data-parallel ranks: `EPISODES`, a dispatch mode that
splits the prompts as `Dispatch.DP_COMPUTE` does and joins the ranks' rows, skipping ranks
whose trajectories were all dropped (an empty batch, no fields), with the episode counts of
every rank merged (`merge_stats`) rather than rank 0's alone.

    @register(dispatch=EPISODES)        # RolloutWorker.generate_episodes
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from baton.batch import Batch
from baton.controller.dispatch import Dispatch, Topology, get_mode, register_dispatch_mode

STATS = "agent_stats"  # meta key of a batch of episode rows: its counts (baton.agents.rollout)


def merge_stats(parts: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """One step's counts from (stats, rows kept) of each rank: dicts of counts and plain
    counts are summed; `*_mean` values (means over kept rows) are weighted by rows kept."""
    out: dict[str, Any] = {}
    kept = sum(k for _, k in parts)
    for key in dict.fromkeys(k for stats, _ in parts for k in stats):
        values = [(stats[key], k) for stats, k in parts if key in stats]
        if all(isinstance(v, dict) for v, _ in values):
            total: Counter = Counter()
            for v, _ in values:
                total.update(v)
            out[key] = dict(total)
        elif key.endswith("_mean"):
            out[key] = sum(v * k for v, k in values) / max(kept, 1)
        else:
            out[key] = sum(v for v, _ in values)
    return out


def _collect_episodes(outputs: list[Any], topo: Topology) -> Batch:
    picked = [outputs[r] for r in topo.collect_ranks()]
    parts = [b.unpadded() for b in picked]
    rows = [b for b in parts if len(b)]
    out = Batch.concat(rows) if rows else Batch()
    out.meta[STATS] = merge_stats([(b.meta.get(STATS, {}), len(b)) for b in parts])
    return out


EPISODES = register_dispatch_mode("dp_episodes", get_mode(Dispatch.DP_COMPUTE).split, _collect_episodes)
