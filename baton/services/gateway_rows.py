"""Finished gateway sessions as training rows: `GatewayRows`, what the rollout worker's
`generate_sessions` (`baton.agents.gateway_run`: serves the gateway, runs the agents) takes
each draw's rows from. The row source a trainer registers for `data.source: gateway` is
`baton.sources.gateway` (it calls that worker method); this is the gateway's side of it,
with the `RowSource` methods so a gateway can be read on its own (tests, a custom loop).

    rows = GatewayRows(gw, group_size=4).rows(step)   # -> Batch

Each step's rows are whole groups of finished (rewarded) sessions, group-major, in Atropos'
ScoredData shape through `baton.services.groups.groups_to_batch` (see `baton.services.gateway`
for how a session's tokens, masks and logprobs are recorded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from baton import fields as F
from baton.batch import Batch

if TYPE_CHECKING:
    from baton.services.gateway import Gateway, Session


def sessions_to_batch(groups: list[list[Session]], tokenizer: Any, pad_id: int) -> Batch:
    """Groups of finished sessions as rows, group-major (see the module docstring)."""
    from baton.services.groups import groups_to_batch

    scored = [{"tokens": [s.tokens for s in g],
               "masks": [[t if m else -100 for t, m in zip(s.tokens, s.mask)] for s in g],
               "inference_logprobs": [s.logprobs for s in g],
               "scores": [s.reward for s in g],
               "finish_reasons": [s.last_finish for s in g],
               "policy_version": min(min(s.versions) for s in g), "env_id": "gateway"} for g in groups]
    parts = [groups_to_batch([g], tokenizer, pad_id, len(g["tokens"])) for g in scored]
    rows = Batch.concat(parts) if len(parts) > 1 else parts[0]
    rows[F.GROUP_INDEX] = torch.tensor([i for i, g in enumerate(groups) for _ in g], dtype=torch.long)
    return rows


class GatewayRows:
    """`baton.sources.RowSource`'s methods over a gateway: each step's rows
    are `groups_per_step` groups of `group_size` finished sessions (rows arrive scored).
    Weight updates are the engine owner's business (an in-process engine shares the
    actor's weights; a `baton serve` engine is pushed to by the driver's server sync)."""

    def __init__(self, gateway: Gateway, group_size: int, groups_per_step: int = 1, wait_s: float | None = None,
                 session_idle_s: float | None = None):
        if group_size < 1 or groups_per_step < 1:
            raise ValueError("group_size and groups_per_step must be >= 1")
        self.gw, self.group_size, self.groups_per_step, self.wait_s = gateway, group_size, groups_per_step, wait_s
        self.session_idle_s = session_idle_s  # an agent silent this long is dropped ("deadline")
        tok = gateway.tok
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        self.sessions_used = 0
        self.boundary_mismatches = 0

    def rows(self, step: int) -> Batch:
        groups = [self.gw.take(self.group_size, self.wait_s, self.session_idle_s) for _ in range(self.groups_per_step)]
        sessions = [s for g in groups for s in g]
        self.sessions_used += len(sessions)
        self.boundary_mismatches += sum(s.boundary_mismatches for s in sessions)
        return sessions_to_batch(groups, self.gw.tok, self.pad_id)

    def weights_updated(self, version: int, check: bool = False) -> list[float] | None:
        return [0.0] if check else None

    def state_dict(self) -> dict[str, Any]:
        return {"sessions_used": self.sessions_used, "boundary_mismatches": self.boundary_mismatches,
                "dropped": dict(self.gw.dropped)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sessions_used = int(state.get("sessions_used", 0))
        self.boundary_mismatches = int(state.get("boundary_mismatches", 0))
        for reason, k in (state.get("dropped") or {}).items():
            self.gw.dropped[reason] = self.gw.dropped.get(reason, 0) + int(k)

    def close(self) -> None:
        pass
