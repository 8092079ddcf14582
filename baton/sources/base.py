"""What every row source is and declares: the `RowSource` protocol the drivers call, and the
`SourceSpec` each source is registered with (`baton.sources.SOURCES`), so the config check,
the driver's choice and `baton launch` read a source's capabilities instead of re-deriving
them from `data.source`, `trainer.mode` and placement.

    rows = source.rows(step)                          # Batch, before rewards (or scored)
    parity = source.weights_updated(version, check)   # push the new weights to the generator(s)
    metrics = source.metrics()                        # the source's own step metrics (agent/*)
    source.checkpointed(step)                         # a checkpoint holds steps <= step: acknowledge
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from baton import fields as F
from baton.batch import Batch


class Prompts(Protocol):
    """What a source reads of the run's state (`baton.trainers.session.state.RunState`): the
    prompt sampler and the step the run starts from."""
    step: int

    def next_prompts(self, n: int) -> Batch: ...


class RowSource(Protocol):
    """Rows that arrive with a role's columns (`rewards`: scored by the source, or by the
    run's reward role on a generator's pool) are not scored again: the driver runs a role
    only on rows without its columns (`baton.trainers.role_specs`)."""

    def rows(self, step: int) -> Batch:
        """The rows of trainer step `step` (1-based)."""
        ...

    def weights_updated(self, version: int, check: bool = False) -> list[float] | None:
        """The trainer's weights are now `version`: make the generator(s) use them. With
        check, return per-engine max |engine - trainer| logprob on a probe prompt."""
        ...

    def metrics(self) -> dict[str, float]:
        """The source's own metrics of the step last returned by `rows` ({} for most)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def checkpointed(self, step: int) -> None:
        """The checkpoint of `step` (with this source's `state_dict`) is written: what its
        steps trained may be acknowledged (the API's groups are never served again)."""
        ...

    def close(self) -> None: ...


REDRAW = 1_000_000  # a step's k-th extra draw samples with the seeds of step s + k * REDRAW


@dataclass(frozen=True)
class SourceSpec:
    """A row source and what it can do, declared once where it is registered.

    data_source     the `data.source` value that selects it ("" = chosen by its driver alone)
    build           "module:attr" of `build(cfg, roles, state) -> RowSource`, imported on use
    evaluate        "module:attr" of `evaluate(cfg, roles, eval_rows) -> metrics`: held-out
                    evaluation the way this source generates (episodes, sessions, or the
                    rollout's greedy and sampled accuracy)
    drivers         the drivers that read rows from it (`baton.trainers.algorithms`): "ppo"
                    (grpo / ppo), "online_dpo", "dpo"
    generator       needs a generator process: the rollout on a pool of its own (chosen when
                    placement puts it apart from the actor, or trainer.mode overlaps)
    draws_more      can draw more rows for a step on demand (DAPO's dynamic sampling)
    greedy_baseline can add one greedy response per prompt (ReMax's baseline)
    bounds_age      reads `trainer.max_staleness` as the oldest rows it serves (in sync mode)
    scored          its rows arrive scored (environments, agents): no reward role
    own_sampling    who samples with settings of their own ("" = this run's rollout, which
                    reads rollout.top_p / top_k)
    section         the config section it runs (`agent:`, `gateway:`), given iff chosen
    sync_only       refuses an overlapping trainer.mode (its rows come from elsewhere)
    launched        its rows come from services `baton launch` starts (API, servers, environments)
    checks_sync     has `sync_metrics()`, called right after `weights_updated`: what the push
                    moved (sync/bytes, sync/seconds, sync/tensors) and whether its receivers
                    hold the trainer's weights by content (sync/verified)
    reads           the config sections and keys only some sources read ("agent",
                    "data.api_url", ...) that this one does; with "reward" for a source whose
                    rows are not `scored` (`read_keys`): one that some source reads and the
                    chosen one does not is refused when a recipe sets it (`unread_keys`)
    """
    data_source: str
    build: str
    evaluate: str = "baton.sources.colocated:evaluate"
    drivers: tuple[str, ...] = ("ppo",)
    generator: bool = False
    draws_more: bool = False
    greedy_baseline: bool = False
    bounds_age: bool = False
    scored: bool = False
    own_sampling: str = ""
    section: str | None = None
    sync_only: bool = False
    launched: bool = False
    checks_sync: bool = False
    reads: tuple[str, ...] = ()

    @property
    def read_keys(self) -> tuple[str, ...]:
        """`reads`, and the `reward:` section unless the rows arrive scored."""
        return self.reads if self.scored else ("reward", *self.reads)


def apart(cfg: Any) -> bool:
    """Whether the rollout sits on a pool other than the actor's (a generator of its own)."""
    p = cfg.placement
    return p.pool_of("rollout") != p.pool_of("actor")


def number_groups(prompts: Batch, step: int, prompts_per_step: int) -> Batch:
    """Give the step's prompts step-unique group indices (step * prompts_per_step + row), so rows
    from several ranks or draws of a step never share a group (`Trajectory.group`)."""
    prompts[F.GROUP_INDEX] = step * prompts_per_step + torch.arange(len(prompts))
    return prompts


__all__ = ["Prompts", "RowSource", "SourceSpec", "apart", "number_groups"]
