"""`GeneratorSource`: rows from a generator on a pool of its own, running ahead of the trainer
within a staleness bound (`trainer.mode`: sync | one_step_off | async; `trainer.max_staleness`);
registered as "generator" in `baton.sources.SOURCES`.

    baton train recipes/grpo_arithmetic.yaml trainer.mode=one_step_off
    baton train recipes/grpo_arithmetic.yaml trainer.mode=async trainer.max_staleness=2

The generator (`baton.workers.generator.GeneratorWorker`, its own process and model copy)
samples the rows of step s+1 while the actor trains on step s; after each update the actor's
weights are pushed to it (`WeightsWorker.full_weights` -> `GeneratorWorker.load_weights`, a
future handed from one pool to the other: the driver neither fetches the tensors nor waits).

Staleness by admission. With k = the mode's bound (sync 0, one_step_off 1, async
max_staleness), the generator is given step s only once the weights of version s-1-k have
been queued on it, so every row of step s is sampled by version max(0, s-1-k) and trained
at version s-1: policy age min(s-1, k). The generator is never asked to run further ahead
(it waits, idle, for the trainer), and nothing it finished is ever dropped: dropping late
samples would bias training toward the short completions that finish first. Calls run on
the generator in the order they were submitted (pushes and steps interleaved), so the
version behind each step is fixed by the schedule, not by timing: a run is as reproducible
as a synchronous one, k=0 samples exactly what the colocated synchronous run samples (the
rows are seeded per (seed, step) either way; tested), and a resumed run continues exactly.
Departure from fully asynchronous systems (AReaL): a batch that is queued keeps the weights
it was admitted with even if newer ones arrive before it starts; when generation, not the
update, is the bottleneck, rows are then k versions old where AReaL's would be fresher.

Scoring: when the reward role is not on the actor's pool (the default for the overlapping
modes puts it beside the generator) the rows are scored right after they are generated, by
a call chained on the generation's future, so scoring overlaps the update too; the rows then
arrive with `rewards` and the driver does not score them again.

Waits: `rows(step)` waits for that step's rows (and scores), through the controller's
futures: a generator process that dies is a `WorkerError` within seconds, never a trainer
waiting forever. `weights_updated` waits for nothing (unless asked to check parity).
Checkpoints: `state_dict()` waits for the steps already admitted and saves their rows (each
with its `policy_version`), the next step to admit and the bound, so a resumed run trains
on exactly the rows, sampled by exactly the versions, that the uninterrupted run would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.batch import Batch
from baton.controller import Future
from baton.sync import build_transport, resolve_weight_sync
from baton.sources.base import Prompts, number_groups


@dataclass
class _Admitted:
    """A step handed to the generator: its rows (and scores) as futures until collected."""
    version: int  # the weights version queued on the generator before this step
    rows: Future | Batch
    scores: Future | None = None

    def collect(self) -> Batch:
        if isinstance(self.rows, Future):
            batch = self.rows.get()
            if self.scores is not None:
                batch = batch.union(self.scores.get())
            self.rows, self.scores = batch, None
        return self.rows


class GeneratorSource:
    """`GeneratorSource(rollout, weights, state, prompts_per_step, max_staleness=, total_steps=,
    reward=)`: rows of a `GeneratorWorker` group (`rollout`) fed by the actor's
    `WeightsWorker` group (`weights`); `reward` given: the source scores the rows too."""

    def __init__(self, rollout: Any, weights: Any, state: Prompts, prompts_per_step: int, *,
                 max_staleness: int, total_steps: int, reward: Any = None,
                 weight_sync: str = "auto") -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        # object_store: the actor returns once its copy is stored; broadcast: both ends meet
        # in a collective (the actor waits for the generator). baton.sync.registry.
        self.transport = build_transport(resolve_weight_sync(weight_sync, "generator"), "generator", rollout, weights=weights)
        self.rollout, self.weights, self.reward, self.state = rollout, weights, reward, state
        self.prompts_per_step, self.k, self.total_steps = prompts_per_step, max_staleness, total_steps
        self.pushed = 0  # the newest weights version queued on the generator (0: what it loaded)
        self.next_step = 1  # the next step to admit
        self.admitted: dict[int, _Admitted] = {}
        self._pushes: list[tuple[int, Future]] = []  # (version, load_weights future) not yet checked

    # --- admission ---------------------------------------------------------------------
    def _admit(self) -> None:
        """Hand the generator every step the bound allows: s <= pushed + 1 + k."""
        while self.next_step <= min(self.total_steps, self.pushed + 1 + self.k):
            s = self.next_step
            rows = self._generate(self.state.next_prompts(self.prompts_per_step), s)
            scores = self.reward.submit("compute_rewards", rows) if self.reward is not None else None
            self.admitted[s] = _Admitted(self.pushed, rows, scores)
            self.next_step += 1

    def _generate(self, prompts: Batch, step: int) -> Future:
        """The generator's call for step `step` (episodes instead: `EpisodeGeneratorSource`)."""
        return self.rollout.submit("generate", number_groups(prompts, step, self.prompts_per_step), step)

    def _check_pushes(self, upto: int) -> None:
        """Raise the error of any push of version <= `upto` (done: queued before rows that
        are back), so a failed weight load stops the run at the next step."""
        keep = []
        for version, fut in self._pushes:
            if version <= upto:
                fut.get()
            else:
                keep.append((version, fut))
        self._pushes = keep

    # --- the RowSource protocol --------------------------------------------------------
    def rows(self, step: int) -> Batch:
        self._admit()
        item = self.admitted.pop(step, None)
        if item is None:
            raise RuntimeError(f"step {step} was never admitted (next to admit: {self.next_step}, "
                               f"weights pushed: {self.pushed}, bound: {self.k})")
        batch = item.collect()
        self._check_pushes(item.version)
        return batch

    def weights_updated(self, version: int, check: bool = False) -> list[float] | None:
        self._pushes.extend((version, fut) for fut in self.transport.push(version))
        self.pushed = version
        self.next_step = max(self.next_step, version + 1)  # resuming from a synchronous run
        self._admit()
        if not check:
            return None
        self._check_pushes(version)  # waits for the push (behind the steps admitted before it)
        prompt_ids, token_ids, engine_lp = self.rollout.probe()
        trainer_lp = self.weights.probe_logprobs(prompt_ids, token_ids)[0]
        return [max((abs(a - b) for a, b in zip(engine_lp, trainer_lp)), default=0.0)]

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The staleness state: the rows of every admitted step (waits for them), the next
        step to admit and the bound."""
        return {"max_staleness": self.k, "next_step": self.next_step,
                "admitted": {s: item.collect() for s, item in sorted(self.admitted.items())},
                "versions": {s: item.version for s, item in self.admitted.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:  # a checkpoint of a synchronous colocated run: nothing was admitted ahead
            return
        self.next_step = int(state["next_step"])
        self.admitted = {int(s): _Admitted(int(state["versions"][s]), rows)
                         for s, rows in state["admitted"].items()}

    def checkpointed(self, step: int) -> None:
        pass  # nothing to acknowledge: the rows admitted ahead are in the checkpoint

    def close(self) -> None:
        self._pushes.clear()  # the pools' shutdown stops whatever is still queued
        self.transport.close()


def generator_args(cfg: Any, roles: dict[str, Any], state: Prompts) -> dict[str, Any]:
    """`GeneratorSource`'s arguments for a run whose rollout is on a pool of its own."""
    p = cfg.placement
    scores = p.pool_of("reward") != p.pool_of("actor")
    return dict(rollout=roles["rollout"], weights=roles["policy_weights"], state=state,
                prompts_per_step=cfg.data.prompts_per_step, max_staleness=cfg.trainer.staleness,
                total_steps=cfg.trainer.steps, reward=roles.get("reward") if scores else None,
                weight_sync=cfg.rollout.weight_sync)


def build(cfg: Any, roles: dict[str, Any], state: Prompts) -> GeneratorSource:
    """The generator of a run whose rollout is on a pool of its own."""
    return GeneratorSource(**generator_args(cfg, roles, state))


__all__ = ["GeneratorSource", "build", "generator_args"]
