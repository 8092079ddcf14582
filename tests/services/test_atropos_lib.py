"""atroposlib's own BaseEnv (0.4.0, in a virtual environment of its own: it needs
transformers 4.x) feeds baton's trainer through `baton api`, unchanged: registration and its
wait for the trainer, /status-env throttling, gzip posts. `tests/services/atropos_env.py`
says how to make the venv; without it (or $ATROPOS_PYTHON) this test is skipped. Slow: the
env process imports atroposlib (~20 s on the shared 2-core VM)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from baton.metrics import read_metrics
from baton.models.load import load_model, load_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.server import ServerThread, build_app
from baton.services.api import build_api_app
from baton.trainers.ppo import train

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "checkpoints/arith-sft")
PYTHON = os.environ.get("ATROPOS_PYTHON", "/work/atropos-venv/.venv/bin/python")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(PYTHON), reason=f"no atroposlib venv at {PYTHON} (see atropos_env.py)")
def test_atroposlib_env_feeds_the_trainer(tmp_path):
    from baton.config import load_config
    from baton.trainers.ppo_config import PPOConfig

    api = ServerThread(build_api_app(str(tmp_path / "api.sqlite")))
    tok = load_tokenizer(MODEL)
    server = ServerThread(build_app(EmbeddedEngine(load_model(MODEL).eval(), tok), tok, "arith-sft",
                                    model_path=MODEL))
    env = subprocess.Popen([PYTHON, str(REPO / "tests/services/atropos_env.py"), "--api", api.url, "--server",
                            server.url, "--tokenizer", MODEL, "--group-size", "4", "--seconds", "600"],
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cfg = load_config(PPOConfig, REPO / "recipes/grpo_arithmetic_api.yaml", [
            f"model.path={MODEL}", f"trainer.run_dir={tmp_path / 'run'}", f"data.api_url={api.url}", "data.envs=[]",
            f"data.servers=[{server.url}]", "data.prompts_per_step=4", "rollout.n=4", "data.eval_size=4",
            "actor.mini_batch_size=16", "actor.micro_batch_size=16", "trainer.steps=2", "trainer.progress=false"])
        train(cfg)
    finally:
        os.killpg(env.pid, signal.SIGKILL)
        env.wait(10)
        server.stop()
        api.stop()
    steps = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    status = api.server.config.app.state.api.env_status()
    assert [e["name"] for e in status] == ["arith_atropos_0"]
