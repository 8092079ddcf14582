"""Metric sinks and the run report.

`MetricsLogger` fans one dict of numbers per step out to
  * `metrics.jsonl` in the run directory (always; one JSON object per line, with `step`),
  * the console: a rich progress bar on a terminal; without one (nohup, SLURM, CI logs,
    where a bar shows nothing until the end) a plain line every few steps (`progress_line`),
  * tensorboard / wandb / mlflow when asked for (`trainer.sinks`: baton/metric_sinks.py;
    optional extras, imported only then; `check_sinks` tells a missing package at config
    time), which also get the run's config at the start and its report image at the end.
`write_report(run_dir)` plots into `report.png` one panel per kind of metric the run has
(`REPORT_PANELS`: reward, held-out accuracy, loss, KL, entropy, response length, DPO margins
and accuracies, critic explained variance, queue health and the staleness histogram of the
trained rows); a panel with no data is left out.
`Timer` collects per-phase wall times as `timing/<phase>_s`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from baton.runs.metrics_log import read_metrics as _read_metrics
from baton.runs.metrics_log import truncate_after

from baton.metric_sinks import PACKAGES, SINKS  # optional metric sinks, beside metrics.jsonl and the console


def check_sinks(sinks: list[str]) -> None:
    """ValueError (one line, naming the package to install) for a sink whose package is not
    importable: checked with the config, before a run writes anything."""
    import importlib.util

    for sink in sinks:
        module, package = PACKAGES.get(sink, (sink, sink))
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"trainer.sinks: {sink!r} needs the {package!r} package, which is not installed "
                             f"(pip install -e '.[{package}]', or drop {sink!r} from trainer.sinks)")


class Timer:
    """`with timer("rollout"): ...` records `timing/rollout_s`."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            key = f"timing/{phase}_s"
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        times, self.times = self.times, {}
        return times


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


# What a plain progress line shows, when the step has it: (key, label, format). `kl_ref`: the
# KL penalty's estimate against the reference (algo.kl_coef > 0; TRL's `kl`); `kl_old`: the
# k3 approximate KL of the updated policy to the one that sampled the rows (PPO's approx_kl).
_LINE_FIELDS = (("reward/mean", "reward", ".3f"), ("actor/loss", "loss", ".4f"), ("sft/loss", "loss", ".4f"),
                ("rm/loss", "loss", ".4f"), ("rm/accuracy", "pair_acc", ".3f"),
                ("rewards/margins", "margin", ".3f"),
                ("rewards/accuracies", "pref_acc", ".3f"), ("actor/kl", "kl_ref", ".4f"),
                ("actor/approx_kl", "kl_old", ".4f"),
                ("eval/accuracy_greedy", "eval", ".3f"), ("eval/accuracy", "eval", ".3f"),
                ("timing/step_s", "step", ".2f"))


def progress_line(step: int, total: int, record: dict[str, Any], elapsed_s: float) -> str:
    """`step 20/300  reward 0.412  loss 0.0123  kl_old 0.0004  step 0.52s  eta 2m26s`."""
    parts = [f"step {step}/{total}"]
    for key, label, fmt in _LINE_FIELDS:
        v = record.get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{label} {v:{fmt}}" + ("s" if key == "timing/step_s" else ""))
    if 0 < step < total and elapsed_s > 0:
        eta = elapsed_s / step * (total - step)
        parts.append(f"eta {int(eta // 60)}m{int(eta % 60):02d}s")
    return "  ".join(parts)


class MetricsLogger:
    """See the module docstring. console: show progress at all; lines: plain lines instead of
    the rich bar (None: when stdout is not a terminal), one every `line_every` steps (0: about
    20 over the run) and on the first and last step. config: the run's resolved config (a
    mapping), which the sinks log at the start."""

    def __init__(self, run_dir: str | Path, total_steps: int, *, console: bool = True,
                 sinks: list[str] | None = None, start_step: int = 0, lines: bool | None = None,
                 line_every: int = 0, config: dict[str, Any] | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if start_step == 0 and self.path.exists():
            self.path.unlink()
        elif start_step:
            self._truncate_after(start_step)
        self._writers: list[Any] = [SINKS[sink](run_dir, config) for sink in sinks or []]
        self._progress = None
        self.total_steps, self._start_step, self._t0 = total_steps, start_step, time.perf_counter()
        self._lines = console and (not sys.stdout.isatty() if lines is None else lines)
        self._line_every = line_every or max(1, total_steps // 20)
        if console and not self._lines:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeRemainingColumn)
            self._progress = Progress(TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(),
                                      TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, info="")
            self._progress.start()

    def _truncate_after(self, step: int) -> None:
        """On resume, drop lines of steps that the checkpoint does not cover (and a torn
        last line), atomically."""
        if self.path.exists():
            truncate_after(self.path, step)

    def sync(self) -> None:
        """fsync metrics.jsonl (before a checkpoint is saved: its step's line is then on disk)."""
        if self.path.exists():
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        for writer in self._writers:
            writer.log(numbers, step)
        if self._lines and step > self._start_step and (
                step % self._line_every == 0 or step == self.total_steps or step == self._start_step + 1):
            print(progress_line(step, self.total_steps, record,
                                (time.perf_counter() - self._t0) * step / max(1, step - self._start_step)), flush=True)
        if self._progress is not None:
            info = "  ".join(progress_line(step, self.total_steps, record, 0.0).split("  ")[1:])
            self._progress.update(self._task, completed=step, info=info)

    def log_image(self, name: str, path: str | Path) -> None:
        """An image (the run's report.png) to every sink."""
        for writer in self._writers:
            writer.image(name, Path(path))

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        for writer in self._writers:
            writer.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of run_dir/metrics.jsonl (a torn last line is skipped with a warning)."""
    return _read_metrics(Path(run_dir) / "metrics.jsonl")


# One panel per kind of metric: (title, keys, y range or None). A panel whose keys no line
# has is left out (offline DPO has no reward, GRPO no DPO margins, only PPO a critic, only
# distillation a teacher).
REPORT_PANELS: tuple[tuple[str, tuple[str, ...], tuple[float, float] | None], ...] = (
    ("training reward", ("reward/mean", "reward/accuracy"), None),
    ("held-out accuracy", ("eval/accuracy_greedy", "eval/accuracy_sampled", "eval/rewards/accuracies",
                           "eval/accuracy"), (0.0, 1.0)),
    ("loss", ("actor/loss", "actor/pg_loss", "critic/vf_loss", "dpo/nll", "sft/loss", "rm/loss", "eval/loss"), None),
    ("KL", ("actor/approx_kl", "actor/kl", "dpo/kl", "rollout/logprob_mismatch_kl", "rollout/behaviour_kl"), None),
    ("entropy", ("actor/entropy",), None),
    ("response length", ("response/length_mean",), None),
    ("DPO margins", ("rewards/margins", "rewards/chosen", "rewards/rejected", "eval/rewards/margins"), None),
    ("DPO preference accuracy", ("rewards/accuracies",), (0.0, 1.0)),
    ("critic explained variance", ("critic/explained_var",), None),
    ("distillation", ("distill/reverse_kl", "distill/teacher_below"), None),
    ("agent turns", ("agent/turns_mean",), None),
    ("agent turn reward", ("agent/turn_reward_mean",), None),
    ("agent: dropped trajectories", ("agent/dropped/*", "eval/dropped/*"), None),  # a key per fault kind seen
    ("queue: idle share", ("throughput/trainer_idle", "throughput/generator_idle"), (0.0, 1.0)),
    ("queue: rows/s", ("throughput/rows_trained_per_s", "throughput/rows_generated_per_s"), None),
    ("update: share of the matmul rate", ("throughput/update_matmul_share",), None),
)
AGE_COUNTS = "queue/age_counts"  # a list a step (rows per policy age): one bar chart over the run
AGE_PANEL = "staleness of trained rows"
SAME_AS = {"actor/pg_loss": "actor/loss"}  # drawn only where it differs (no KL or entropy term: the same line)


def has_queue(mode: str | None, source: str | None) -> bool:
    """Whether a run's rows wait in a queue, so that the queue's idle shares, rates and
    staleness say something: generation overlaps the update (`trainer.mode` one_step_off /
    async), or the rows come from services running beside the trainer (`data.source=api`).
    A sync run alternates generating and training: its idle shares are only the phases'."""
    return mode != "sync" or source == "api"


def _run_has_queue(run_dir: str | Path) -> bool:
    """`has_queue` for the run dir's config.yaml (True without one: nothing to tell by)."""
    import yaml

    try:
        cfg = yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return True
    trainer, data = cfg.get("trainer") or {}, cfg.get("data") or {}
    return has_queue(trainer.get("mode"), data.get("source")) if isinstance(trainer, dict) and isinstance(
        data, dict) else True


def _keys(keys: tuple[str, ...], rows: list[dict[str, Any]]) -> list[str]:
    """The keys `rows` have numbers for; "prefix/*" stands for every key under prefix/."""
    out: list[str] = []
    for k in keys:
        names = (sorted({n for r in rows for n in r if n.startswith(k[:-1])}) if k.endswith("/*") else [k])
        out += [n for n in names if any(isinstance(r.get(n), (int, float)) for r in rows)]
    return [k for k in out if not (k in SAME_AS and SAME_AS[k] in out
                                   and all(r.get(k) == r.get(SAME_AS[k]) for r in rows))]


def report_panels(rows: list[dict[str, Any]], queue: bool = True
                  ) -> list[tuple[str, list[str], tuple[float, float] | None]]:
    """The panels of REPORT_PANELS that `rows` have data for, each with the keys it plots;
    without a queue (`has_queue`) no queue or staleness panels."""
    out = []
    for title, keys, ylim in REPORT_PANELS:
        present = _keys(keys, rows)
        if present and (queue or not title.startswith("queue:")):
            out.append((title, present, ylim))
    if queue and any(r.get(AGE_COUNTS) for r in rows):
        out.append((AGE_PANEL, [AGE_COUNTS], None))
    return out


def _age_histogram(rows: list[dict[str, Any]]) -> list[int]:
    """Trained rows per policy age over the run (the steps' AGE_COUNTS summed)."""
    total: list[int] = []
    for r in rows:
        for age, n in enumerate(r.get(AGE_COUNTS) or []):
            total.extend([0] * (age + 1 - len(total)))
            total[age] += n
    return total


def write_report(run_dir: str | Path) -> Path:
    """Plot every metric kind the run has (`report_panels`) over steps into report.png.

    Drawn on a plain `Figure` (no pyplot state) with margins fixed in inches: tight_layout's
    text measuring took ~30% of the report's time (every `baton train` writes one at its end)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    rows = read_metrics(run_dir)
    panels = report_panels(rows, queue=_run_has_queue(run_dir)) or [("no metrics yet", [], None)]
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    width, height = 5.0 * cols, 3.3 * nrows
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.65 / width, right=1 - 0.15 / width, top=1 - 0.35 / height, bottom=0.5 / height,
                        wspace=0.28, hspace=0.55)
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax, (title, keys, ylim) in zip(axes.flat, panels):
        if title == AGE_PANEL:
            hist = _age_histogram(rows)
            ax.bar(range(len(hist)), hist)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(title)
            ax.set_xlabel("policy age (versions behind the trained weights)")
            ax.set_ylabel("rows")
            continue
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            ax.plot(*zip(*pts), marker="o" if len(pts) < 12 else None, markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        if ylim:
            ax.set_ylim(*ylim)
        if keys:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.remove()  # no empty panels
    out = Path(run_dir) / "report.png"
    fig.savefig(out, dpi=100)
    return out
