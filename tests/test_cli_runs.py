"""`baton train` on a real tiny run, as a user drives it: resuming with changed
hyperparameters is refused listing them (unless trainer.resume_changes=allow), resume=auto
on a finished run says so and exits 0, Ctrl-C (a real SIGINT) is one line naming the step."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from baton.cli import main
from baton.metrics import read_metrics
from baton.models.make import make_tiny_checkpoint

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.prompts_per_step=4", "data.eval_size=4", "rollout.n=4", "rollout.max_new_tokens=4",
        "actor.micro_batch_size=8", "actor.mini_batch_size=8", "actor.lr=1e-3", "trainer.progress=false",
        "placement.threads_per_worker=1"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


def train(model_dir, run_dir, *extra):
    return main(["train", "recipes/grpo_arithmetic.yaml", f"model.path={model_dir}", f"trainer.run_dir={run_dir}",
                 *TINY, *extra])


def test_resume_changes_and_a_finished_run(model_dir, tmp_path, capsys, monkeypatch):
    import logging

    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as under `baton`: warnings reach stderr by themselves
    run = tmp_path / "run"
    assert train(model_dir, run, "trainer.steps=1") == 0
    capsys.readouterr()
    assert train(model_dir, run, "trainer.steps=1", "trainer.resume=auto") == 0  # nothing to do
    err = capsys.readouterr().err
    assert "already finished" in err and "raise trainer.steps" in err and err.count("\n") == 1, err
    assert train(model_dir, run, "trainer.steps=2", "trainer.resume=auto", "actor.lr=0.01") == 1
    err = capsys.readouterr().err
    assert "actor.lr: 0.001 -> 0.01" in err and "trainer.resume_changes=allow" in err and err.count("\n") == 1, err
    assert f"`baton train {run / 'config.yaml'} trainer.resume=auto` resumes with the run's own config" in err
    assert yaml.safe_load((run / "config.yaml").read_text())["actor"]["lr"] == 0.001  # not overwritten
    assert [r["step"] for r in read_metrics(run)] == [0, 1]
    assert train(model_dir, run, "trainer.steps=2", "trainer.resume=auto", "actor.lr=0.01",
                 "trainer.resume_changes=allow") == 0
    out, err = capsys.readouterr()
    assert "trainer.resume_changes=allow: actor.lr: 0.001 -> 0.01" in out
    assert (out + err).count(f"resuming {run} from checkpoint step_1 (step 1 of 2)") == 1, (out, err)  # once
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    assert yaml.safe_load((run / "config.yaml").read_text())["actor"]["lr"] == 0.01


@pytest.mark.slow  # ~15 s: a real run interrupted by SIGINT (the CLI's line itself: tests/test_cli.py)
def test_sigint_is_one_line_naming_the_step(model_dir, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "train", str(REPO / "recipes/grpo_arithmetic.yaml"),
                             f"model.path={model_dir}", f"trainer.run_dir={run}", *TINY, "trainer.steps=400",
                             "trainer.save_every=2"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run / "checkpoints" / "step_2").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    (line,) = [ln for ln in err.splitlines() if ln.startswith("baton:")]  # the step in progress is saved (issue 30)
    assert "stopped by SIGINT (Ctrl-C) after step" in line and "trainer.resume=auto" in line, line
    step = int(line.split("after step ")[1].split()[0])
    assert (run / "checkpoints" / f"step_{step}").is_dir(), line


def test_the_corrected_rerun_of_a_run_that_failed_at_start_is_not_refused(model_dir, tmp_path, capsys, monkeypatch):
    """A model dir that passes the start checks but cannot load (a NaN weight in weights too
    large to read before the run: found once they are in memory; 0-byte weights are refused
    before the run dir) fails after the run dir got its config.yaml; the corrected rerun into
    the same dir just runs."""
    import shutil

    from baton.models import validate

    monkeypatch.setattr(validate, "FINITE_BEFORE_LOAD_BYTES", 0)  # as for a checkpoint over 2 GiB

    from safetensors.torch import load_file, save_file


    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    next(t for t in tensors.values() if t.is_floating_point()).view(-1)[0] = float("nan")
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    run = tmp_path / "run"
    assert train(str(broken), run, "trainer.steps=1") == 2  # ModelLoadError: one line
    assert "NaN/inf value(s)" in capsys.readouterr().err
    assert (run / "config.yaml").exists()
    capsys.readouterr()
    assert train(model_dir, run, "trainer.steps=1") == 0
    assert "never trained a step: reusing it" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run)] == [0, 1]
