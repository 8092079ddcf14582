"""Where a step's rows come from: one seam every RL driver calls (the PPO family and
online DPO).

A row source turns a step number into that step's rows — prompt x n samples with
prompt/response ids and masks, behaviour logprobs, finish reason, completion text and the
`policy_version` that sampled each row (see baton.fields) — and is told when the trainer's
weights reach a new version:

    rows = source.rows(step)                          # Batch, before rewards (or scored)
    parity = source.weights_updated(version, check)   # push the new weights to the generator(s)

The driver does not care which source it has, beyond staleness accounting (policy age is
logged from `policy_version`). `choose_source.row_source(cfg, roles, state)` picks one:

    RolloutSource    this run's rollout role, colocated with the actor (its engine reads the
                     actor's weights in place: an update is a version bump); it alone can
                     draw more rows for a step (DAPO's dynamic sampling) and a greedy
                     response per prompt (ReMax)
    GeneratorSource  a rollout pool of its own running ahead of the trainer within
                     `trainer.max_staleness` (baton.trainers.async_source)
    ApiSource        the trajectory API fed by environment services (data.source: api;
                     baton.trainers.api_source): rows arrive scored

A source's own state (beyond the prompt sampler, which `RunState` saves) goes into
checkpoints through `state_dict` / `load_state_dict`.
"""

from __future__ import annotations

from typing import Any, Protocol

from baton.batch import Batch
from baton.trainers.run_state import RunState


class RowSource(Protocol):
    def rows(self, step: int) -> Batch:
        """The rows of trainer step `step` (1-based)."""
        ...

    def weights_updated(self, version: int, check: bool = False) -> list[float] | None:
        """The trainer's weights are now `version`: make the generator(s) use them. With
        check, return per-engine max |engine - trainer| logprob on a probe prompt."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class RolloutSource:
    """Rows from this run's rollout role, on prompts drawn by the run's sampler."""

    def __init__(self, rollout: Any, state: RunState, prompts_per_step: int, greedy_baseline: bool = False) -> None:
        self.rollout, self.state, self.prompts_per_step = rollout, state, prompts_per_step
        self.greedy_baseline = greedy_baseline  # also one greedy response per prompt (ReMax)

    def rows(self, step: int, draw: int = 0) -> Batch:
        """The rows of `step`; `draw` > 0: more rows for the same step, on new prompts with
        sampling seeds of their own (DAPO's dynamic sampling)."""
        return self.rollout.generate(self.state.next_prompts(self.prompts_per_step), step + 1_000_000 * draw,
                                     greedy_baseline=self.greedy_baseline)

    def weights_updated(self, version: int, check: bool = False) -> list[float] | None:
        return self.rollout.sync_weights(version, check=check)

    def state_dict(self) -> dict[str, Any]:
        return {}  # the prompt sampler's position is saved by RunState

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass

