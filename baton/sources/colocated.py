"""`RolloutSource`: rows from this run's rollout role, colocated with the actor (its engine
reads the actor's weights in place: an update is a version bump). It alone can draw more rows
for a step (DAPO's dynamic sampling) and a greedy response per prompt (ReMax); registered as
"rollout" in `baton.sources.SOURCES`.

A source's own state (beyond the prompt sampler, which `RunState` saves) goes into
checkpoints through `state_dict` / `load_state_dict`.
"""

from __future__ import annotations

from typing import Any

from baton.batch import Batch
from baton.sources.base import REDRAW, Prompts, number_groups


class RolloutSource:
    """Rows from this run's rollout role, on prompts drawn by the run's sampler."""

    def __init__(self, rollout: Any, state: Prompts, prompts_per_step: int, greedy_baseline: bool = False) -> None:
        self.rollout, self.state, self.prompts_per_step = rollout, state, prompts_per_step
        self.greedy_baseline = greedy_baseline  # also one greedy response per prompt (ReMax)

    def rows(self, step: int, draw: int = 0) -> Batch:
        """The rows of `step`; `draw` > 0: more rows for the same step, on new prompts with
        sampling seeds of their own (DAPO's dynamic sampling)."""
        seed_step = step + REDRAW * draw  # also numbers the draw's groups apart from the step's others
        prompts = number_groups(self.state.next_prompts(self.prompts_per_step), seed_step, self.prompts_per_step)
        return self.rollout.generate(prompts, seed_step, greedy_baseline=self.greedy_baseline)

    def weights_updated(self, version: int, check: bool = False) -> list[float] | None:
        return self.rollout.sync_weights(version, check=check)

    def sync_metrics(self) -> dict[str, float]:
        """Right after `weights_updated`: what the sync moved and `sync/verified` (the engine
        holds the trainer's weights byte for byte: `RolloutWorker.sync_metrics`)."""
        return self.rollout.sync_metrics()[0]

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}  # the prompt sampler's position is saved by RunState

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def checkpointed(self, step: int) -> None:
        pass  # nothing to acknowledge: the sampler's position is in the checkpoint

    def close(self) -> None:
        pass


def evaluate_rollout(rollout: Any, eval_rows: list[dict]) -> dict[str, float]:
    """Held-out accuracy of the current policy: greedy, and sampled (4 samples per prompt);
    `eval/timeouts`, `eval/errors`: verifier calls that hung or raised (scored wrong)."""
    out = {"eval/timeouts": 0.0, "eval/errors": 0.0}
    for mode in ("greedy", "sampled"):
        res = rollout.evaluate(eval_rows, mode == "greedy")
        out[f"eval/accuracy_{mode}"] = res["accuracy"]
        out["eval/timeouts"] += res["timeouts"]
        out["eval/errors"] += res["errors"]
    return out


def evaluate(cfg: Any, roles: dict[str, Any], eval_rows: list[dict]) -> dict[str, float]:
    """The registered evaluation of the rollout's sources (colocated, ahead, the API): the
    rollout role's held-out accuracy (`evaluate_rollout`)."""
    return evaluate_rollout(roles["rollout"], eval_rows)


def build(cfg: Any, roles: dict[str, Any], state: Prompts) -> RolloutSource:
    """The colocated rollout of `cfg` (ReMax: also one greedy response per prompt)."""
    return RolloutSource(roles["rollout"], state, cfg.data.prompts_per_step, greedy_baseline=getattr(cfg, "remax", False))
