"""Finished gateway sessions as training rows: `GatewayRows`, what the rollout worker's
`generate_sessions` (`baton.agents.gateway_run`: serves the gateway, runs the agents) takes
each draw's rows from. The row source a trainer registers for `data.source: gateway` is
`baton.sources.gateway` (it calls that worker method); this is the gateway's side of it,
with the `RowSource` methods so a gateway can be read on its own (tests, a custom loop).

    rows = GatewayRows(gw, group_size=4).rows(step)   # -> Batch

Each step's rows are whole groups of finished (rewarded) sessions, group-major, as
`baton.rows.Trajectory`s (see `baton.services.gateway` for how a session's tokens, masks and
logprobs are recorded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.batch import Batch
from baton.rows import Trajectory, to_batch
from baton.services.groups import finish_of, split_sequence

if TYPE_CHECKING:
    from baton.services.gateway import Gateway, Session


def sessions_to_batch(groups: list[list[Session]], tokenizer: Any, pad_id: int) -> Batch:
    """Groups of finished sessions as rows, group-major, group g's sessions in group g: a
    session's prompt is its tokens before the first sampled one, its response the rest (the
    tokens the gateway added between turns under mask 0), its version its group's oldest."""
    eos = getattr(tokenizer, "eos_token_id", None)
    trajs = []
    for gi, g in enumerate(groups):
        version = min(min(s.versions) for s in g)
        for s in g:
            prompt, response, mask = split_sequence(s.tokens, s.mask, trained=bool)
            trajs.append(Trajectory(prompt, response, logprobs=[float(x) for x in s.logprobs[len(prompt):]],
                                    loss_mask=mask, reward=float(s.reward), version=version,
                                    token_versions=s.sampled_by[len(prompt):],
                                    finish_reason=finish_of(s.last_finish, response, eos), group=gi))
    return to_batch(trajs, pad_id, tokenizer)


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
