"""Generation on a pool of its own, overlapping the update (trainer.mode, baton.sources.ahead):
the placement the modes derive and refuse, staleness 0 = the synchronous run exactly, policy
age under one_step_off, a killed generator as an error within seconds, and an exact resume
with the staleness state (rows sampled ahead, by the versions that sampled them)."""

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from baton.config import ConfigError, load_config
from baton.controller import WorkerError
from baton.controller.placement import PlacementConfig
from baton.metrics import read_metrics
from baton.trainers import ppo
from baton.trainers.ppo_config import PPOConfig

TINY = ["data.prompts_per_step=4", "data.eval_size=8", "rollout.n=4", "rollout.max_new_tokens=6",
        "actor.micro_batch_size=8", "actor.mini_batch_size=8", "actor.lr=1e-3", "trainer.progress=false",
        "placement.threads_per_worker=1", "reward.max_workers=1"]
DROP = ("timing/", "throughput/", "sync/")  # sync/: what the placement's own transport moved


@pytest.fixture(scope="module")
def model_dir():
    """The shipped warm start (0.82M parameters, like the tiny test models): its rewards vary,
    so every update really moves the weights (a random model's rewards are all 0, its
    advantages too, and every version would be the same weights)."""
    return str(Path(__file__).resolve().parents[2] / "checkpoints/arith-sft")


def config(model_dir, run_dir, *extra):
    """The config as loading leaves it: placed (a generator ahead on its pool)."""
    return load_config(PPOConfig, "recipes/grpo_arithmetic.yaml",
                       [f"model.path={model_dir}", f"trainer.run_dir={run_dir}", *TINY, *extra])


def steps(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(DROP)} for r in read_metrics(run_dir)]


def test_modes_place_the_generator_or_say_what_to_set(tmp_path):
    cfg = config("m", tmp_path, "trainer.mode=one_step_off")
    unplaced = dataclasses.replace(cfg, placement=PlacementConfig())  # built, not loaded: checked only
    assert unplaced.placement.roles == {}  # the config's checks only check; loading places
    with pytest.raises(ConfigError, match="was not placed: build it with load_config"):
        ppo.train(dataclasses.replace(unplaced, trainer=dataclasses.replace(cfg.trainer, run_dir=str(tmp_path / "r"))))
    assert not (tmp_path / "r").exists()  # refused before anything is written
    p = cfg.placement
    assert (p.roles, p.pools, cfg.trainer.staleness) == ({"rollout": "gen", "reward": "gen"}, {"gen": 1}, 1)
    with pytest.warns(UserWarning, match="algo.off_policy=decoupled_ppo corrects it"):  # measured: k=2 uncorrected learns worse
        assert config("m", tmp_path, "trainer.mode=async").trainer.staleness == 2
    assert config("m", tmp_path, "trainer.mode=async", "trainer.max_staleness=0").trainer.staleness == 0
    assert config("m", tmp_path).placement.roles == {}  # sync: colocated, as before
    with pytest.raises(ConfigError, match="placement.pools.gen=1 placement.roles.rollout=gen"):
        config("m", tmp_path, "trainer.mode=one_step_off", "placement.roles.rollout=main")
    with pytest.raises(ConfigError, match="trainer.mode=async trainer.max_staleness=2"):
        config("m", tmp_path, "trainer.mode=one_step_off", "trainer.max_staleness=2")
    with pytest.raises(ConfigError, match="max_staleness must be >= 0"):
        config("m", tmp_path, "trainer.mode=async", "trainer.max_staleness=-1")
    with pytest.raises(ConfigError, match="with data.source=api the rows come from the environments"):
        config("m", tmp_path, "trainer.mode=one_step_off", "data.source=api", "reward.max_workers=4")
    with pytest.raises(ConfigError, match="weight_sync=broadcast needs the generator in a process of its own"):
        config("m", tmp_path, "placement.roles.rollout=gen", "placement.pools.gen=1", "rollout.weight_sync=broadcast")


@pytest.mark.ray
@pytest.mark.parametrize("weight_sync", ["object_store", pytest.param("broadcast", marks=pytest.mark.slow)])
def test_staleness_zero_reproduces_the_sync_run_exactly(model_dir, tmp_path, weight_sync):
    """The colocated synchronous run (one process, the engine reads the actor in place) and
    the async machinery with max_staleness 0 (a generator process with its own weights,
    pushed after every step by either transport) give the same metrics line for line: same
    rows, same rewards, same losses and gradient norms."""
    ppo.train(config(model_dir, tmp_path / "sync", "trainer.steps=2"))
    ppo.train(config(model_dir, tmp_path / "k0", "trainer.steps=2", "trainer.mode=async",
                      "trainer.max_staleness=0", "trainer.check_weight_sync=true",
                      f"rollout.weight_sync={weight_sync}"))
    sync, k0 = steps(tmp_path / "sync"), steps(tmp_path / "k0")
    assert [r["step"] for r in sync] == [0, 1, 2]
    assert sync == k0


@pytest.mark.ray
@pytest.mark.slow  # ~30 s here: two runs, each with a generator process
def test_one_step_off_ages_and_resumes_exactly_with_its_staleness_state(model_dir, tmp_path):
    full = tmp_path / "full"
    ppo.train(config(model_dir, full, "trainer.steps=3", "trainer.save_every=2", "trainer.mode=one_step_off"))
    rows = steps(full)
    assert [r.get("rollout/policy_age") for r in rows] == [None, 0.0, 1.0, 1.0]
    # resume from the mid-run checkpoint: step 3's rows were sampled (by version 1) before it
    # was written, and come back from it rather than being sampled again by version 2
    ppo.train(config(model_dir, tmp_path / "part", "trainer.steps=3", "trainer.mode=one_step_off",
                      f"trainer.resume={full / 'checkpoints' / 'step_2'}"))
    again = [r for r in steps(tmp_path / "part") if r["step"] == 3]
    assert again == [rows[3]]


@pytest.mark.ray
def test_a_killed_generator_is_an_error_within_seconds(model_dir, tmp_path, monkeypatch):
    """Kill -9 the generator's process after step 2 of a one_step_off run: the trainer raises
    a WorkerError within seconds. (The steps before it also show the off-policy correction
    at work: decoupled PPO, whose mismatch KL is ~0 at step 1, sampled by the weights being
    trained, and positive from step 2 on, sampled one version earlier.)"""
    built = {}

    def build_roles(*args, **kwargs):
        built.update(real(*args, **kwargs))
        return built

    real = ppo.build_roles
    monkeypatch.setattr(ppo, "build_roles", build_roles)
    killed = {}

    def kill_after_step_two():
        metrics = tmp_path / "metrics.jsonl"
        while not (metrics.exists() and '"step": 2' in metrics.read_text()):
            time.sleep(0.05)
        os.kill(built["rollout"].pids[0], signal.SIGKILL)
        killed["at"] = time.monotonic()

    killer = threading.Thread(target=kill_after_step_two, daemon=True)
    killer.start()
    with pytest.raises(WorkerError, match="died") as err:
        ppo.train(config(model_dir, tmp_path, "trainer.steps=200", "trainer.mode=one_step_off",
                          "algo.off_policy=decoupled_ppo"))
    waited = time.monotonic() - killed["at"]
    assert waited < 10, f"the trainer noticed the dead generator only after {waited:.1f} s"
    assert "GeneratorWorker" in str(err.value) or "RewardWorker" in str(err.value)
    rows = {r["step"]: r for r in read_metrics(tmp_path)}
    assert rows[1]["rollout/policy_age"] == 0 and rows[1]["off_policy/mismatch_kl"] < 1e-6
    assert rows[2]["rollout/policy_age"] == 1 and rows[2]["off_policy/mismatch_kl"] > 1e-6
    assert 0 <= rows[2]["off_policy/capped_frac"] < 1


@pytest.mark.ray
@pytest.mark.slow  # ~40 s: two fsdp2 actor ranks and a generator, per transport
@pytest.mark.parametrize("weight_sync", ["object_store", "broadcast"])
def test_a_sharded_actor_feeds_the_generator(model_dir, tmp_path, weight_sync):
    """fsdp2 on two Ray ranks: every rank takes part in gathering the full tensors (rank 0
    alone would wait forever), and the generator then samples with exactly the trainer's
    weights (the parity check after every push)."""
    ppo.train(config(model_dir, tmp_path, "trainer.steps=2", "trainer.mode=async", "trainer.max_staleness=0",
                      "placement.backend=ray", "placement.world_size=2", "actor.strategy=fsdp2",
                      "trainer.check_weight_sync=true", f"rollout.weight_sync={weight_sync}"))
    assert [r["step"] for r in steps(tmp_path)] == [0, 1, 2]
