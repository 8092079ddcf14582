"""Metric sinks and the run report.

`MetricsLogger` fans one dict of numbers per step out to
  * `metrics.jsonl` in the run directory (always; one JSON object per line, with `step`),
  * a rich progress bar on the console (step, reward, step time),
  * tensorboard / wandb when asked for (optional extras, imported only then).
`write_report(run_dir)` plots reward and accuracy over steps into `report.png`.
`Timer` collects per-phase wall times as `timing/<phase>_s`.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from baton.runs.metrics_log import read_metrics as _read_metrics
from baton.runs.metrics_log import truncate_after

SINKS = ("tensorboard", "wandb")  # optional metric sinks, beside metrics.jsonl and the console
_SINK_MODULES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}  # module, pip name


def check_sinks(sinks: list[str]) -> None:
    """ValueError (one line, naming the package to install) for a sink whose package is not
    importable: checked with the config, before a run writes anything."""
    import importlib.util

    for sink in sinks:
        module, package = _SINK_MODULES.get(sink, (sink, sink))
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"trainer.sinks: {sink!r} needs the {package!r} package, which is not installed "
                             f"(pip install {package}, or drop {sink!r} from trainer.sinks)")


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


class MetricsLogger:
    def __init__(self, run_dir: str | Path, total_steps: int, *, console: bool = True,
                 sinks: list[str] | None = None, start_step: int = 0) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if start_step == 0 and self.path.exists():
            self.path.unlink()
        elif start_step:
            self._truncate_after(start_step)
        self._writers: list[Any] = []
        for sink in sinks or []:
            if sink == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter  # optional extra
                self._writers.append(("tb", SummaryWriter(str(Path(run_dir) / "tb"))))
            elif sink == "wandb":
                import wandb  # optional extra
                self._writers.append(("wandb", wandb.init(dir=str(run_dir))))
            else:
                raise ValueError(f"unknown metric sink {sink!r}; use one of {list(SINKS)}")
        self._progress = None
        if console:
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

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for kind, writer in self._writers:
            numbers = {k: v for k, v in record.items() if isinstance(v, (int, float))}
            if kind == "tb":
                for k, v in numbers.items():
                    writer.add_scalar(k, v, step)
            else:
                writer.log(numbers, step=step)
        if self._progress is not None:
            info = (f"reward {record.get('reward/mean', float('nan')):.3f}  "
                    f"step {record.get('timing/step_s', float('nan')):.2f}s")
            if "eval/accuracy_greedy" in record:
                info += f"  eval {record['eval/accuracy_greedy']:.3f}"
            self._progress.update(self._task, completed=step, info=info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        for kind, writer in self._writers:
            writer.close() if kind == "tb" else writer.finish()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of run_dir/metrics.jsonl (a torn last line is skipped with a warning)."""
    return _read_metrics(Path(run_dir) / "metrics.jsonl")


def write_report(run_dir: str | Path) -> Path:
    """Plot reward (and held-out accuracy where evaluated) over steps into report.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    steps = [r["step"] for r in rows if "reward/mean" in r]
    axes[0].plot(steps, [r["reward/mean"] for r in rows if "reward/mean" in r], label="reward/mean")
    if any("reward/accuracy" in r for r in rows):
        axes[0].plot(steps, [r.get("reward/accuracy", float("nan")) for r in rows if "reward/mean" in r],
                     label="train accuracy (sampled)")
    axes[0].set_xlabel("step")
    axes[0].set_title("training reward")
    axes[0].legend()
    for key in ("eval/accuracy_greedy", "eval/accuracy_sampled"):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        if pts:
            axes[1].plot(*zip(*pts), marker="o", label=key)
    axes[1].set_xlabel("step")
    axes[1].set_title("held-out accuracy")
    axes[1].set_ylim(0, 1)
    if axes[1].lines:
        axes[1].legend()
    fig.tight_layout()
    out = Path(run_dir) / "report.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
