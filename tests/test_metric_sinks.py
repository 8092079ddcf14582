"""The metric sinks of `trainer.sinks` (baton/metric_sinks.py), in their offline modes, read back:
a TensorBoard event file, a wandb offline run dir, a local MLflow file store; each gets every
step's numbers, the run's config and the report image.

Their packages are optional extras, not in the test venv: each test skips without its package.
Run by hand with them installed beside the venv (how this file was run, docs/LOGGING.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.metrics import MetricsLogger, check_sinks, write_report

CONFIG = {"actor": {"lr": 1e-4, "mini_batch_size": 128}, "trainer": {"steps": 2, "sinks": ["x"]}}


def _run(tmp_path: Path, sink: str) -> Path:
    run_dir = tmp_path / "run"
    log = MetricsLogger(run_dir, 2, console=False, sinks=[sink], config=CONFIG)
    log.log(1, {"reward/mean": 0.25, "actor/loss": -0.5})
    log.log(2, {"reward/mean": 0.5, "actor/loss": -0.25, "eval/accuracy_greedy": 0.75})
    log.log_image("report", write_report(run_dir))
    log.close()
    return run_dir


def test_tensorboard_event_file_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = _run(tmp_path, "tensorboard")
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0, "tensors": 0}).Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5)]
    assert events.Images("report") and events.Images("report")[0].width > 100
    assert "actor" in json.dumps([t.tensor_proto.string_val for t in events.Tensors("config/text_summary")], default=str)


def test_wandb_offline_writes_its_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = _run(tmp_path, "wandb")
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((run_dir / "wandb").iterdir())
    (records,) = runs[0].glob("run-*.wandb")  # what `wandb sync` uploads: protobuf records, strings as they are
    data = records.read_bytes()
    assert b'\x05actor' in data and b'{"lr":0.0001,"mini_batch_size":128}' in data  # the config, a section per key
    assert data.count(b"reward/mean") >= 2 and b"eval/accuracy_greedy" in data  # the steps' numbers
    assert list((runs[0] / "files" / "media" / "images").glob("report_*.png"))

def test_mlflow_local_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = _run(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("baton").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["actor.lr"] == "0.0001" and run.data.params["trainer.sinks"] == "['x']"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [(1, 0.25),
                                                                                                      (2, 0.5)]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.yaml", "report.png"}


def test_a_missing_sink_package_is_one_line_naming_its_extra():
    import importlib.util

    missing = [s for s in ("tensorboard", "wandb", "mlflow") if importlib.util.find_spec(s) is None]
    if not missing:
        pytest.skip("every sink package is installed here")
    with pytest.raises(ValueError, match=rf"trainer.sinks: '{missing[0]}' needs the '{missing[0]}' package.*"
                                         rf"pip install -e '\.\[{missing[0]}\]'"):
        check_sinks([missing[0]])
