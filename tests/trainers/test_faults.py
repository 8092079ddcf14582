"""Faults a careful user provokes, each against a real run of the GRPO driver on a tiny
model (docs/RELIABILITY.md lists them): training that goes non-finite, two runs in one run
dir, a fresh run into a finished run's dir, a driver killed with SIGKILL while it saves
checkpoints, a torn metrics line and a corrupt latest checkpoint at resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from baton.config import load_config
from baton.metrics import read_metrics
from baton.models.make import make_tiny_checkpoint
from baton.runs.rundir import RunDirError
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig
from baton.trainers.session.run import NonFiniteError

TINY = ["data.prompts_per_step=4", "data.eval_size=4", "rollout.n=4", "rollout.max_new_tokens=6",
        "actor.micro_batch_size=8", "actor.mini_batch_size=8", "actor.lr=1e-3", "trainer.progress=false",
        "placement.threads_per_worker=1"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


def config(model_dir, run_dir, *extra):
    return load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml",
                       [f"model.path={model_dir}", f"trainer.run_dir={run_dir}", *TINY, *extra])


def test_non_finite_training_stops_naming_the_step_and_saves_no_nan(tmp_path):
    # the SFT warm start: its rewards vary, so the first optimizer step moves it (a random model's
    # are all 0). Adam moves each weight by ~lr: at lr=1e20 the next forward's products pass
    # float32's 3.4e38 on every CPU (lr=1e6 only saturated the softmax on some: a collapsed,
    # finite policy with zero advantages).
    with pytest.raises(NonFiniteError, match=r"step \d+: non-finite") as err:
        train(config(str(REPO / "checkpoints/arith-sft"), tmp_path, "actor.lr=1e20", "trainer.steps=30", "trainer.save_every=1",
                     "trainer.max_nonfinite_steps=2", "actor.grad_clip=1e9"))
    stopped_at = int(str(err.value).split()[1].rstrip(":"))
    assert stopped_at < 30
    rows = [r for r in read_metrics(tmp_path) if r["step"] > 0]
    assert rows[-1]["trainer/nonfinite_steps"] == 2  # the line of the stopping step is written
    for ckpt in (tmp_path / "checkpoints").glob("step_*"):  # every checkpoint is trainable
        weights = load_file(str(ckpt / "model.safetensors"))
        assert all(t.isfinite().all() for t in weights.values()), ckpt


def test_a_finished_run_dir_is_refused_and_left_as_it_was(model_dir, tmp_path):
    train(config(model_dir, tmp_path, "trainer.steps=1"))
    before = {p: p.read_bytes() for p in (tmp_path / "config.yaml", tmp_path / "metrics.jsonl")}
    with pytest.raises(RunDirError, match="trainer.resume=auto.*trainer.overwrite=true|trainer.overwrite=true.*trainer.resume=auto"):
        train(config(model_dir, tmp_path, "trainer.steps=2"))
    assert {p: p.read_bytes() for p in before} == before
    train(config(model_dir, tmp_path, "trainer.steps=2", "trainer.overwrite=true"))  # explicit: allowed
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]


def test_a_second_run_in_a_locked_run_dir_is_refused(model_dir, tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from baton.runs.rundir import RunDirLock; "
                               "lock = RunDirLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=f"in use by pid {holder.pid}"):
            train(config(model_dir, tmp_path, "trainer.steps=1"))
        assert not (tmp_path / "config.yaml").exists()  # refused before writing anything
    finally:
        holder.kill()
        holder.wait()
    train(config(model_dir, tmp_path, "trainer.steps=1"))  # the dead holder's lock does not block


@pytest.mark.slow  # ~20 s; a SIGKILL during saves in the default run: tests/runs/test_checkpoints.py
def test_sigkill_while_saving_then_resume_loses_nothing(model_dir, tmp_path):
    """SIGKILL the driver at a random point of a run that saves every step; resume=auto
    continues from the newest complete checkpoint, and metrics.jsonl has each step once."""
    args = [sys.executable, "-m", "baton.cli", "train", str(REPO / "recipes/grpo_arithmetic.yaml"),
            f"model.path={model_dir}", f"trainer.run_dir={tmp_path}", *TINY, "trainer.save_every=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*args, "trainer.steps=400"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (tmp_path / "checkpoints" / "step_3").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended early"
        time.sleep(0.05)
    time.sleep(0.37)  # somewhere inside a later step, often inside a save
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run([*args, "trainer.steps=8", "trainer.resume=auto"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == list(range(0, 9)), steps
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if not p.name.startswith("step_")) == []


def test_resume_skips_a_torn_metrics_line_and_a_corrupt_latest_checkpoint(model_dir, tmp_path, capsys):
    train(config(model_dir, tmp_path, "trainer.steps=3", "trainer.save_every=1"))
    (tmp_path / "checkpoints" / "step_3" / "model.safetensors").write_bytes(b"")  # 0-byte weights
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward/me')  # a torn last line (power loss mid-write)
    train(config(model_dir, tmp_path, "trainer.steps=4", "trainer.resume=auto"))
    assert "step_3" in capsys.readouterr().out  # the skipped checkpoint is named
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == [0, 1, 2, 3, 4], steps  # step 3 re-run from step_2, no duplicate, no torn line
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])


def test_keep_checkpoints_keeps_the_last_k(model_dir, tmp_path):
    train(config(model_dir, tmp_path, "trainer.steps=4", "trainer.save_every=1", "trainer.keep_checkpoints=2"))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_3", "step_4"]


def test_a_nan_reward_is_counted_and_never_reaches_the_loss(model_dir, tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))  # the reward workers get this path too
    import reward_fns  # noqa: F401  (registers test/nan; a light module the reward workers import fast)

    train(config(model_dir, tmp_path, "trainer.steps=1", "reward.functions.test/nan=1.0"))
    step = [r for r in read_metrics(tmp_path) if r["step"] == 1][0]
    assert step["reward/nonfinite"] == 16 and step["reward/mean"] == 0.0  # 4 prompts x 4 samples
    assert step["actor/loss"] == step["actor/loss"]  # finite, not NaN


def test_sigterm_saves_the_step_and_resume_continues(tmp_path):
    """SIGTERM (how preemptible clusters and SLURM give notice) mid-run: the step in progress
    finishes, is saved, the run stops with exit code 143 naming the step, and resume=auto
    continues from that checkpoint to the end."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "baton.cli", "train", str(REPO / "recipes/grpo_arithmetic.yaml"),
            f"trainer.run_dir={run_dir}", "trainer.steps=200", "data.prompts_per_step=4", "rollout.n=4",
            "actor.mini_batch_size=16", "actor.micro_batch_size=16", "data.eval_size=4", "trainer.progress=false"]
    proc = subprocess.Popen(args, cwd=REPO, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.2)  # wait for step 2's line: the run is training
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    line = err.strip().splitlines()[-1]
    assert "stopped by SIGTERM after step" in line and "trainer.resume=auto" in line, err
    step = int(line.split("after step ")[1].split()[0])
    assert (run_dir / "checkpoints" / f"step_{step}").is_dir() and step < 200
    train(config(str(REPO / "checkpoints/arith-sft"), run_dir, f"trainer.steps={step + 1}", "trainer.resume=auto",
                 "data.prompts_per_step=4", "rollout.n=4", "actor.mini_batch_size=16", "actor.micro_batch_size=16",
                 "data.eval_size=4", "trainer.resume_changes=allow"))  # config() adds TINY's lr and lengths
    assert [r["step"] for r in read_metrics(run_dir)][-1] == step + 1


def test_a_reward_that_always_fails_stops_the_run_naming_it(model_dir, tmp_path):
    """A reward function that raises on every call: after reward.max_failed_steps steps in a
    row with every call failed, the run stops (the step's line written first)."""
    sys.path.insert(0, str(Path(__file__).parent))  # the reward workers get this path too
    import reward_fns  # noqa: F401  (registers test/always_raises)

    with pytest.raises(RuntimeError, match="every reward call failed in 2 steps in a row") as e:
        train(config(model_dir, tmp_path, "trainer.steps=10", "reward.max_failed_steps=2",
                     "reward.functions={test/always_raises: 1.0}"))
    assert "errors 16" in str(e.value)
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
