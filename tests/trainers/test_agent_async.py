"""`data.source: agent` on a generator of its own (trainer.mode one_step_off / async,
`EpisodeGeneratorSource`): staleness 0 reproduces the synchronous colocated agent run
exactly (same episodes, rewards, losses), and one_step_off trains on episodes one version
old, their behaviour logprobs weighed by the off-policy correction."""

from pathlib import Path

import pytest

from baton.config import load_config
from baton.metrics import read_metrics
from baton.trainers import ppo
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes/agent_guess.yaml"  # multi-turn, per-turn rewards: signal from the first step
SMALL = [f"model.path={REPO / 'checkpoints/arith-sft'}", "data.prompts_per_step=2", "rollout.n=2",
         "data.eval_size=2", "actor.mini_batch_size=0", "actor.micro_batch_size=4", "trainer.progress=false",
         "actor.lr_warmup_steps=0", "actor.lr=1e-3"]
DROP = ("timing/", "throughput/", "sync/")  # sync/: what the placement's own transport moved


def config(run_dir, *extra):
    return load_config(PPOConfig, RECIPE, [f"trainer.run_dir={run_dir}", *SMALL, *extra])


def steps(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(DROP)} for r in read_metrics(run_dir)]


@pytest.mark.ray
def test_agent_staleness_zero_reproduces_the_sync_run_exactly(tmp_path):
    """Episodes sampled by a generator process with its own weights (pushed after each step,
    parity-checked) are the colocated run's episodes: every metric line is equal."""
    ppo.train(config(tmp_path / "sync", "trainer.steps=2"))
    ppo.train(config(tmp_path / "k0", "trainer.steps=2", "trainer.mode=async", "trainer.max_staleness=0",
                     "trainer.check_weight_sync=true"))
    sync, k0 = steps(tmp_path / "sync"), steps(tmp_path / "k0")
    assert [r["step"] for r in sync] == [0, 1, 2]
    assert sync[1]["agent/turns_mean"] > 1 and sync[1]["actor/grad_norm"] > 0
    assert sync == k0


@pytest.mark.ray
def test_agent_one_step_off_trains_on_episodes_one_version_old(tmp_path):
    """Step 1's episodes come from the weights being trained (mismatch KL ~0: the trainer's
    logprobs on every policy token of every turn are the engine's); step 2's were sampled by
    version 0 while the actor is at version 1 (age 1, mismatch KL > 0, corrected)."""
    ppo.train(config(tmp_path, "trainer.steps=2", "trainer.mode=one_step_off", "algo.off_policy=decoupled_ppo"))
    rows = {r["step"]: r for r in steps(tmp_path)}
    assert rows[1]["rollout/policy_age"] == 0 and rows[1]["off_policy/mismatch_kl"] < 1e-6
    assert rows[2]["rollout/policy_age"] == 1 and rows[2]["off_policy/mismatch_kl"] > 1e-6
    assert rows[2]["agent/trajectories"] == 4 and rows[2]["agent/turns_mean"] > 1


@pytest.mark.ray
@pytest.mark.slow  # 10-25 s here: two runs, each with a generator process (the default run has the ages)
def test_agent_one_step_off_resumes_exactly_with_its_staleness_state(tmp_path):
    """Step 3's episodes, sampled by version 1 before the step-2 checkpoint was written, come
    back from it (rows, masks, behaviour logprobs, counts): the resumed step 3 is the
    uninterrupted run's step 3."""
    full = tmp_path / "full"
    ppo.train(config(full, "trainer.steps=3", "trainer.save_every=2", "trainer.mode=one_step_off"))
    rows = steps(full)
    assert [r.get("rollout/policy_age") for r in rows] == [None, 0.0, 1.0, 1.0]
    ppo.train(config(tmp_path / "part", "trainer.steps=3", "trainer.mode=one_step_off",
                     f"trainer.resume={full / 'checkpoints' / 'step_2'}"))
    again = [r for r in steps(tmp_path / "part") if r["step"] == 3]
    assert again == [rows[3]] and "agent/trajectories" in again[0]


@pytest.mark.ray
def test_agent_episodes_on_two_ray_ranks(tmp_path):
    """placement.backend=ray, world_size 2: each rank runs the episodes of its half of the
    prompts; the driver gets every rank's rows (groups numbered across ranks) and counts."""
    ppo.train(config(tmp_path, "trainer.steps=1", "placement.backend=ray", "placement.world_size=2"))
    rows = {r["step"]: r for r in steps(tmp_path)}
    assert rows[1]["agent/trajectories"] == 4 and rows[1]["agent/turns_mean"] > 1
    assert "actor/loss" in rows[1] and "eval/accuracy_greedy" in rows[1]
