"""The run session every driver runs inside: open, lock, resume, log, evaluate, end of step,
checkpoint, close, report — written once.

    with RunSession(cfg) as run:                        seed; lock + prepare the run dir; config.yaml
        run.roles = build_roles(...)                    closed by the session, whatever happens
        run.start(state, restore=..., evaluate=...)     resume (restore(checkpoint path)), metrics log,
                                                        first evaluation of a fresh run
        for step, timed in run.steps():                 the loop header; `timed("update")` times a phase
            ...the algorithm's lines...
            run.end_step(step, metrics, save=...)       guard, evaluation when due, the metrics line,
                                                        the checkpoint when due, the timeline
    return run.result()                                 start/eval/* and the last eval/*

The loop itself stays in the driver, readable top to bottom; the session is a helper it
calls, not a base class it inherits. Guarantees (see docs/RELIABILITY.md): one run per run
dir at a time (a lock); a non-empty run dir is refused unless resumed or overwritten;
config.yaml is written only after the config validated, atomically; a step's metrics line
is written before its checkpoint, so a crash between them resumes from the previous
checkpoint and re-runs the step instead of losing its line; a torn last metrics line is
skipped; the newest *complete* checkpoint is resumed (incomplete ones are named and
skipped); the last `trainer.keep_checkpoints` are kept; non-finite updates stop the run
naming the step; `report.png` is written when the run ends without an error.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from typing import Any, Callable

import torch

from baton.config import save_config, to_dict
from baton.controller import shutdown_ray
from baton.metrics import MetricsLogger, Timer, write_report
from baton.models.config import check_export_path, check_model_path
from baton.runs.checkpoints import CHECKPOINTS_DIR, prune_checkpoints
from baton.runs.metrics_log import read_metrics, truncate_after
from baton.runs.resume_checks import check_data_unchanged, check_resume_changes
from baton.runs.rundir import PreparedRun, prepare_run_dir
from baton.trainers.session.config import TrainerConfig
from baton.trainers.session.inputs import check_data, data_files

log = logging.getLogger("baton")


class NonFiniteError(FloatingPointError):
    """Training produced non-finite losses or gradients too often to go on."""


def check_inputs(cfg: Any) -> None:
    """What must exist before a run writes anything (a ConfigError, one line): the model dir
    (with a config.json), a critic's own backbone, a teacher with the student's vocabulary,
    and an export path that holds no model."""
    model = getattr(cfg, "model", None)
    if hasattr(model, "check"):
        model.check()
    elif isinstance(getattr(model, "path", None), str):
        check_model_path(model.path)
    critic = getattr(cfg, "critic", None)  # a critic's own backbone ("" = the actor's model.path)
    if getattr(critic, "path", ""):
        check_model_path(critic.path, "critic.path")
    teacher = getattr(cfg, "teacher", None)  # a distillation teacher: its dir, and the student's vocabulary
    if teacher is not None:
        teacher.check_files(cfg.model.path, topk=getattr(getattr(cfg, "algo", None), "distill_topk", 0))
    check_export_path(getattr(cfg.trainer, "save_path", None))  # an export never overwrites a model (the shipped one)


def open_run(cfg: Any) -> PreparedRun:
    """Lock and prepare `cfg.trainer.run_dir` (refusing a finished run's dir unless
    `trainer.resume` or `trainer.overwrite`), then write config.yaml atomically. `cfg` has
    already been validated by its dataclass, so nothing is written for a bad config."""
    t: TrainerConfig = cfg.trainer
    check_inputs(cfg)
    check_data(cfg)  # every data file read and checked row by row: before the model loads, before the run dir
    run = prepare_run_dir(t.run_dir, resume=t.resume, overwrite=t.overwrite, steps=t.steps)
    try:
        allow = t.resume_changes == "allow"
        if not run.fresh:
            read_metrics(run.metrics_path)  # damaged mid-file: MetricsLogError now, before the model loads
            changes = check_resume_changes(run.path, to_dict(cfg), allow=allow)
            run.notices += [f"trainer.resume_changes=allow: {c}" for c in changes]
        changes = check_data_unchanged(run.path, data_files(cfg), fresh=run.fresh, allow=allow,  # size + sha256
                                       notices=run.notices)
        run.notices += [f"trainer.resume_changes=allow: {c}" for c in changes]
        for notice in run.notices:  # printed once; the log keeps it at INFO (a WARNING would print it twice)
            log.info("%s", notice)
            print(f"baton: {notice}")
        save_config(cfg, run.path / "config.yaml")
    except BaseException:
        run.close()
        raise
    return run


def metrics_logger(run: PreparedRun, t: TrainerConfig, start_step: int, cfg: Any = None) -> MetricsLogger:
    """The step metrics sink (the extra sinks get `cfg`, the run's config); on resume, lines
    after `start_step` (steps the checkpoint does not cover, and a torn last line) are dropped first."""
    if start_step and run.metrics_path.exists():
        truncate_after(run.metrics_path, start_step)
    if start_step:
        lost = sorted(set(range(1, start_step + 1)) - {r.get("step") for r in read_metrics(run.metrics_path)})
        if lost:  # a deleted file, or a line lost with the page cache (one torn beside its checkpoint)
            notice = (f"{run.metrics_path} has no line for {len(lost)} of the {start_step} steps the checkpoint "
                      f"covers (steps {_spans(lost)}): their metrics are lost; the run goes on from step {start_step}")
            log.warning("%s", notice)
            print(f"baton: {notice}")
    return MetricsLogger(run.path, t.steps, console=t.progress, sinks=t.sinks, start_step=start_step,
                         config=to_dict(cfg) if cfg is not None and t.sinks else None)


def _spans(steps: list[int]) -> str:
    """Sorted steps as spans: [1, 2, 3, 7] -> "1-3, 7"."""
    spans: list[list[int]] = []
    for s in steps:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def is_due(step: int, every: int, last: bool) -> bool:
    return last or bool(every and step % every == 0)


def save_checkpoint(actor: Any, run: PreparedRun, t: TrainerConfig, step: int,
                    driver_state: dict[str, Any]) -> str:
    """`actor.save_checkpoint` into checkpoints/step_N (atomic), then keep the last K."""
    path = actor.save_checkpoint(str(run.path / CHECKPOINTS_DIR / f"step_{step}"), driver_state)
    prune_checkpoints(run.path, t.keep_checkpoints)
    return path


class NonFiniteGuard:
    """Counts steps whose loss or gradient norm was not finite (the actor skipped those
    optimizer steps); `check` records the count in the step's metrics and returns the
    NonFiniteError (naming the step) to raise once there are `limit`, so the driver can log
    that step's line first."""

    KEYS = ("actor/loss", "actor/grad_norm")

    def __init__(self, limit: int) -> None:
        self.limit, self.count = limit, 0

    def check(self, step: int, metrics: dict[str, Any]) -> NonFiniteError | None:
        bad = [k for k in self.KEYS if k in metrics and not math.isfinite(metrics[k])]
        if metrics.get("actor/nonfinite_skipped"):
            bad.append(f"{metrics['actor/nonfinite_skipped']:g} optimizer step(s) skipped")
        if not bad:
            return None
        self.count += 1
        metrics["trainer/nonfinite_steps"] = self.count
        log.warning("step %d: non-finite training (%s); optimizer step skipped (%d/%d)",
                    step, ", ".join(bad), self.count, self.limit)
        if self.count < self.limit:
            return None
        return NonFiniteError(f"step {step}: non-finite loss or gradient ({', '.join(bad)}) in "
                                 f"{self.count} step(s) (trainer.max_nonfinite_steps={self.limit}); the "
                                 f"weights were not updated by those steps and no checkpoint of them was "
                              f"written. Lower actor.lr or check the rewards.")


class RewardFailureError(RuntimeError):
    """Every reward call failed (raised, hung, or was not finite) for too many steps in a row."""


class RewardFailureGuard:
    """Counts steps in a row where every reward call failed (`reward/calls` calls, all of them
    `reward/errors` + `reward/timeouts` + `reward/nonfinite`): such a step trains on rewards of
    0 that no function gave. `check` returns the error to raise (after the step's line) at
    `limit` steps in a row; a step with one call that worked resets the count."""

    def __init__(self, limit: int) -> None:
        self.limit, self.count = limit, 0

    def check(self, step: int, metrics: dict[str, Any]) -> RewardFailureError | None:
        calls = metrics.get("reward/calls", 0)
        failed = sum(metrics.get(f"reward/{k}", 0) for k in ("errors", "timeouts", "nonfinite"))
        self.count = self.count + 1 if calls and failed >= calls else 0
        if self.count < self.limit:
            return None
        return RewardFailureError(
            f"step {step}: every reward call failed in {self.count} steps in a row ({failed:g} of {calls:g} calls "
            f"this step: errors {metrics.get('reward/errors', 0):g}, timeouts {metrics.get('reward/timeouts', 0):g}, "
            f"not finite {metrics.get('reward/nonfinite', 0):g}; reward.max_failed_steps={self.limit}): the run "
            f"would train on rewards of 0. Check the reward function (run it on one row by hand).")


class StepEnd:
    """The end of every driver's step, in one place (`end(step, metrics, timer, t0, save=)`):
    count non-finite training (`guard`), evaluate when due, log the step's line (with the
    previous step's save time, its timings, and tokens/s where rows were sampled), then
    raise the guard's error if it has one, and save when due (timed into the next line).
    The line is written before the checkpoint, so a resume never loses it. `final_eval`:
    the last evaluation's metrics."""

    def __init__(self, t: TrainerConfig, log: MetricsLogger, guard: NonFiniteGuard,
                 evaluate: Callable[[], dict[str, float]], *more_guards: Any) -> None:
        self.t, self.log, self.guards, self.evaluate = t, log, [guard, *more_guards], evaluate
        self.carry: dict[str, float] = {}  # the save's timing, logged with the next step
        self.final_eval: dict[str, float] = {}

    def __call__(self, step: int, metrics: dict[str, Any], timer: Any, t0: float,
                 save: Callable[[], None]) -> None:
        metrics = {**self.carry, **metrics}
        stops = [g.check(step, metrics) for g in self.guards]  # an error naming the step after K bad steps
        stop = next((e for e in stops if e is not None), None)
        last = step == self.t.steps
        if is_due(step, self.t.eval_every, last):
            with timer("eval"):
                metrics.update(self.evaluate())
        metrics.update(timer.pop())
        metrics["timing/step_s"] = time.perf_counter() - t0
        if "rollout/tokens" in metrics:
            metrics["throughput/tokens_per_s"] = metrics["rollout/tokens"] / metrics["timing/step_s"]
        self.log.log(step, metrics)  # before the checkpoint: a resume never loses this line
        if stop:
            raise stop
        self.final_eval = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        self.carry = {}
        if is_due(step, self.t.save_every, last):
            self.log.sync()  # the line on disk before the checkpoint is: a power loss never keeps one alone
            with timer("save"):
                save()
            self.carry = timer.pop()


def close_run(run: PreparedRun, roles: dict[str, Any], backend: str) -> None:
    """Stop every role group once (colocated roles share one), Ray if we started it, and
    release the run dir's lock."""
    try:
        groups = {id(g): g for g in roles.values()}.values()
        on_ray = backend == "ray" or any(getattr(getattr(g, "pool", None), "backend_name", "") == "ray"
                                      for g in groups)  # a pool may run on Ray on its own
        for group in groups:
            group.shutdown()
        if on_ray:
            shutdown_ray(only_ours=True)
    finally:
        run.close()


class Preempted(RuntimeError):
    """The run got SIGTERM (a preemptible node or SLURM giving notice) or SIGINT (Ctrl-C) and
    stopped after saving its last finished step. `signum`: which (the CLI exits 128 + it)."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = signum


SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)"}


class RunSession:
    """One run of any driver, from the lock to the report (see the module docstring).

    `roles`: {role: WorkerGroup}, set by the driver once built; every group is shut down
    (and Ray, if the run started it) when the session closes. `closing`: objects whose
    `close()` runs first (row sources). `timeline`: a `baton.trainers.session.timeline.Timeline`
    the session feeds (the records of evaluation and saving are no step's)."""

    def __init__(self, cfg: Any) -> None:
        self.cfg, self.t = cfg, cfg.trainer
        torch.manual_seed(self.t.seed)
        self.run = open_run(cfg)  # locked; refuses a finished run's dir; config.yaml written
        self.roles: dict[str, Any] = {}
        self.closing: list[Any] = []
        self.timeline: Any = None
        self.state: Any = None
        self.log: MetricsLogger | None = None
        self.end: StepEnd | None = None
        self._term: int | None = None  # the signal number once SIGTERM / SIGINT arrived
        self._in_step = False  # between `steps()` handing out a step and its `end_step`
        self._saved_step = self._unsaved = None  # the last step saved / the save of the last step
        self._old_handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            self._old_handlers = {s: signal.signal(s, self._on_signal) for s in SIGNAL_NAMES}

    @property
    def path(self):
        return self.run.path

    def __enter__(self) -> "RunSession":
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        """First SIGTERM or SIGINT: finish the step, save it, stop (see `steps`): the same under
        every placement, since the workers never get the driver's signals (Ray's processes
        have process groups of their own: `baton.controller.ray_backend`). A second one, or
        one before the first step (building the roles, loading models): stop now, SIGINT as
        the KeyboardInterrupt it always was."""
        name = SIGNAL_NAMES.get(signum, f"signal {signum}")
        if self._term is not None or self.state is None:
            for s, handler in self._old_handlers.items():
                signal.signal(s, handler)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Preempted(f"stopped by {name} at once, without saving the step in progress"
                            if self._term is not None else f"stopped by {name} before the first step", signum)
        self._term = signum
        again = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        if self._in_step:  # the step the loop is in; else the last one ended (its evaluation, its save)
            log.warning("%s: finishing step %d, saving it, then stopping (%s again stops at once, without saving "
                        "it)", name, self.state.step + 1, again)
        elif self.state.step:
            log.warning("%s: stopping after step %d, saved first (%s again stops at once)", name, self.state.step,
                        again)
        else:
            log.warning("%s: stopping before step 1 (nothing to save yet)", name)

    def __exit__(self, kind, error, tb) -> None:
        for s, handler in self._old_handlers.items():
            signal.signal(s, handler)
        try:
            for thing in self.closing:
                if thing is not None:
                    thing.close()
            if error is None:  # before the metric sinks close: they log the report too
                report = write_report(self.run.path)
                if self.log is not None:
                    self.log.log_image("report", report)
            if self.log is not None:
                self.log.close()
        finally:
            close_run(self.run, self.roles, getattr(getattr(self.cfg, "placement", None), "backend", "local"))

    def start(self, state: Any, *, restore: Callable[[str], None] | None = None,
              evaluate: Callable[[], dict[str, float]] | None = None,
              guard: NonFiniteGuard | None = None, evaluate_at_start: bool = True) -> None:
        """Resume (`restore(checkpoint path)` loads the roles and `state`), open the metrics
        log, and evaluate a fresh run's starting model (logged as step 0) unless told not to."""
        self.state = state
        if self.run.resume_from and restore is not None:
            restore(str(self.run.resume_from))
        self.log = metrics_logger(self.run, self.t, start_step=state.step, cfg=self.cfg)
        evaluation = None
        if evaluate is not None:
            def evaluation() -> dict[str, float]:
                out = evaluate()
                self._forget()
                return out
        reward = getattr(self.cfg, "reward", None)
        self.end = StepEnd(self.t, self.log, guard or NonFiniteGuard(self.t.max_nonfinite_steps), evaluation or dict,
                           *([RewardFailureGuard(reward.max_failed_steps)] if reward is not None else []))
        if self.timeline is not None:
            self.timeline.start(state.step)
        if state.step == 0 and evaluation is not None and evaluate_at_start:
            state.first_eval = evaluation()
            self.log.log(0, state.first_eval)
        self._forget()

    def steps(self):
        """(step, timed) for every step left; `timed(name)` is a context timing a phase."""
        while self.state.step < self.t.steps:
            self._stop_if_preempted()
            self._timer, self._t0 = Timer(), time.perf_counter()
            self._in_step = True
            yield self.state.step + 1, self._timer
        self._stop_if_preempted()

    def _stop_if_preempted(self) -> None:
        if self._term is None:
            return
        step = self.state.step
        if self._unsaved is not None and self._saved_step != step:
            self._unsaved()
        raise Preempted(f"stopped by {SIGNAL_NAMES.get(self._term, self._term)} after step {step} of {self.t.steps}"
                        + (f"; checkpoint step_{step} saved: continue with trainer.resume=auto" if step else ""),
                        self._term)

    def end_step(self, step: int, metrics: dict[str, Any], save: Callable[[], None]) -> None:
        """The step is done: its timeline, then `StepEnd` (guard, evaluation, the line, the
        checkpoint when due: `save()`)."""
        self.state.step, self._in_step = step, False
        if self.timeline is not None:
            metrics = {**metrics, **self.timeline.record(step)}

        def saving() -> None:
            save()
            self._forget()
            self._saved_step = step

        self._unsaved = saving
        self.end(step, metrics, self._timer, self._t0, save=saving)

    def _forget(self) -> None:
        if self.timeline is not None:
            self.timeline.forget()

    def result(self) -> dict[str, float]:
        """The starting model's evaluation (start/eval/...) and the last one (eval/...)."""
        first = (self.state.first_eval or {}) if self.state is not None else {}
        return {**{f"start/{k}": v for k, v in first.items()}, **(self.end.final_eval if self.end else {})}
