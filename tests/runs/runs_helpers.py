"""Helpers for tests/runs (importable as `runs_helpers`): small but real checkpoint
directories (a safetensors file that safe_open reads, JSON configs, a zip-format trainer
state like torch.save writes), and bounded waits for child processes."""

import json
import os
import signal
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[2]


def write_checkpoint(d: Path, version: str = "v1", after_file=lambda: None) -> Path:
    """A complete checkpoint in `d` (created); `version` is recorded in config.json and the
    trainer state, so a test can tell which save a directory came from. `after_file` is
    called after each file is written (crash-injection tests count it as a step)."""
    d.mkdir(parents=True, exist_ok=True)
    save_file({"w": np.full((64,), len(version), np.float32)}, str(d / "model.safetensors"))
    after_file()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "version": version}))
    after_file()
    (d / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<pad>"}))
    after_file()
    (d / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    after_file()
    with zipfile.ZipFile(d / "trainer_state.pt", "w") as z:
        z.writestr("archive/data.pkl", json.dumps({"version": version}))
    after_file()
    return d


def version_of(d: Path) -> str:
    return json.loads((d / "config.json").read_text())["version"]


def child_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def wait_child(pid: int, timeout: float = 30.0) -> int:
    """waitpid with a deadline (SIGKILL and fail past it); returns the exit status code, or
    -signal."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"child {pid} did not finish within {timeout} s")
        time.sleep(0.01)


PYTHON = sys.executable
