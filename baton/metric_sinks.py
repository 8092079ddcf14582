"""The optional metric sinks `trainer.sinks` names, beside metrics.jsonl: TensorBoard, Weights &
Biases, MLflow (docs/LOGGING.md). Each is a class registered in `SINKS` and built with the run
dir and the run's resolved config:

    sink = SINKS["tensorboard"](run_dir, config)   # the config logged once, at the start
    sink.log({"reward/mean": 0.41, ...}, step)      # every step's numbers
    sink.image("report", run_dir / "report.png")   # the run's report, at its end
    sink.close()

Their packages are optional extras (`pip install -e '.[wandb]'`, `[tensorboard]`, `[mlflow]`),
imported only by the sink a run chose; `PACKAGES` names what `check_sinks` (baton/metrics.py)
looks for at config time. Where each writes:
  * tensorboard: RUN/tb/ (event files: scalars, the config as text, the report as an image);
  * wandb: RUN/wandb/ (`WANDB_MODE=offline` keeps it there; `wandb sync` uploads it later),
    the config as the run's config, the report as an image; project from WANDB_PROJECT;
  * mlflow: the tracking server in MLFLOW_TRACKING_URI, else a local file store RUN/mlruns/
    (MLFLOW_ALLOW_FILE_STORE=true is set for it: MLflow 3 refuses a file store without it);
    experiment MLFLOW_EXPERIMENT_NAME (default "baton"); the config as params (dotted keys) and
    as the artifact config.yaml, the report as the artifact report.png.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from baton.registry import Registry

SINKS: Registry = Registry("metric sink")
# sink -> (the module it imports, the extra that installs it)
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"actor": {"lr": 1e-4}} -> {"actor.lr": 1e-4}."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _yaml(config: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False)


@SINKS.register("tensorboard")
class TensorBoardSink:
    def __init__(self, run_dir: str | Path, config: dict[str, Any] | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(str(Path(run_dir) / "tb"))
        if config:
            self.writer.add_text("config", "```\n" + _yaml(config) + "```", 0)

    def log(self, numbers: dict[str, float], step: int) -> None:
        for k, v in numbers.items():
            self.writer.add_scalar(k, v, step)

    def image(self, name: str, path: Path) -> None:
        from matplotlib.image import imread

        self.writer.add_image(name, imread(str(path))[..., :3], dataformats="HWC")

    def close(self) -> None:
        self.writer.close()


@SINKS.register("wandb")
class WandbSink:
    def __init__(self, run_dir: str | Path, config: dict[str, Any] | None) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(dir=str(run_dir), name=Path(run_dir).name, config=config or {})

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.run.log(numbers, step=step)

    def image(self, name: str, path: Path) -> None:
        self.run.log({name: self.wandb.Image(str(path))})

    def close(self) -> None:
        self.run.finish()


@SINKS.register("mlflow")
class MLflowSink:
    """Through an `MlflowClient` of its own: no process-wide active run or tracking URI is set."""

    def __init__(self, run_dir: str | Path, config: dict[str, Any] | None) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # a local file store in the run dir (MLflow 3 asks for this opt-in to use one)
            uri = (Path(run_dir).resolve() / "mlruns").as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "baton")
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment, run_name=Path(run_dir).name).info.run_id
        if config:
            params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
            self.client.log_text(self.run_id, _yaml(config), "config.yaml")

    def log(self, numbers: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in numbers.items()])

    def image(self, name: str, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
