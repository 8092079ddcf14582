"""`baton train` as a job on an existing 3-node cluster (RAY_ADDRESS set, as `ray job submit`
and a KubeRay RayJob do): the actor's two data-parallel ranks on two nodes, the generator
(trainer.mode=one_step_off) pinned to the third, a checkpoint written once per save, and a
resume from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mn_cluster import start_cluster, stop_cluster

pytestmark = pytest.mark.slow  # a 3-node cluster and two short runs: minutes on a busy 2-core machine

REPO = Path(__file__).resolve().parents[2]
SMALL = ["data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4", "data.eval_size=2",
         "actor.mini_batch_size=0", "trainer.eval_every=0", "trainer.progress=false", "trainer.save_every=1"]


def _train(address: str, run_dir: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "baton.cli", "train", str(REPO / "recipes/grpo_arithmetic.yaml"),
            f"trainer.run_dir={run_dir}", f"trainer.steps={steps}", *SMALL,
            "placement.backend=ray", "placement.world_size=2", "placement.threads_per_worker=1",
            "placement.strategy=STRICT_SPREAD", "placement.resources={main: {actor_node: 1}, gen: {gen_node: 1}}",
            "trainer.mode=one_step_off", *extra]
    env = {**os.environ, "RAY_ADDRESS": address, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_train_and_resume_across_nodes(tmp_path):
    cluster, _ = start_cluster([1, 1, 1], [{"actor_node": 1}, {"actor_node": 1}, {"gen_node": 1}])
    try:
        run_dir = tmp_path / "run"
        p = _train(cluster.address, run_dir, 2)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        assert max(steps) == 2
        ckpts = sorted(d.name for d in (run_dir / "checkpoints").iterdir() if d.is_dir())
        assert len(ckpts) == 2, ckpts  # one per save (save_every=1), not one per rank or node
        p = _train(cluster.address, run_dir, 3, "trainer.resume=auto")
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        assert max(steps) == 3 and steps.count(1) == 1  # resumed at step 3, not restarted
    finally:
        stop_cluster(cluster)
