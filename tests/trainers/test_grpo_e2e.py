"""Whole GRPO runs on a tiny random model: local backend, Ray with split pools, exact resume."""


import pytest

from baton.config import load_config
from baton.metrics import read_metrics
from baton.models.make import make_tiny_checkpoint
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig

TINY = ["data.prompts_per_step=4", "data.eval_size=8", "rollout.n=4", "rollout.max_new_tokens=6",
        "actor.micro_batch_size=8", "actor.mini_batch_size=8", "actor.lr=1e-3", "trainer.progress=false"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


def run(model_dir, run_dir, *extra):
    cfg = load_config(PPOConfig, "recipes/grpo_arithmetic.yaml",
                      [f"model.path={model_dir}", f"trainer.run_dir={run_dir}", *TINY, *extra])
    return train(cfg)


def test_two_steps_local(model_dir, tmp_path):
    result = run(model_dir, tmp_path, "trainer.steps=2", "algo.kl_coef=0.01", "trainer.check_weight_sync=true")
    rows = read_metrics(tmp_path)
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    for key in ("reward/mean", "timing/step_s", "timing/rollout_s", "timing/update_s",
                "actor/grad_norm", "actor/kl", "rollout/policy_age"):
        assert key in steps[0], key
    assert steps[0]["rollout/policy_age"] == 0  # on-policy: sampled by the version being updated
    assert "eval/accuracy_greedy" in result and "start/eval/accuracy_greedy" in result
    assert (tmp_path / "report.png").stat().st_size > 0
    assert (tmp_path / "config.yaml").exists()
    assert (tmp_path / "checkpoints" / "step_2" / "config.json").exists()


def test_resume_gives_identical_next_step(model_dir, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    run(model_dir, full, "trainer.steps=3", "trainer.save_every=2")
    run(model_dir, part, "trainer.steps=2")
    run(model_dir, part, "trainer.steps=3", "trainer.resume=auto")
    a = [r for r in read_metrics(full) if r["step"] == 3]
    b = [r for r in read_metrics(part) if r["step"] == 3]
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/"))}
    assert drop(a[0]) == drop(b[0])


def test_a_raising_reward_function_is_counted_not_fatal(model_dir, tmp_path):
    from baton.rewards.runner import REWARD_FUNCTIONS, register_reward

    if "test/always_raises" not in REWARD_FUNCTIONS:
        @register_reward("test/always_raises")
        def _always_raises(prompt, completion, **row):
            raise ValueError("verifier bug")

    run(model_dir, tmp_path, "trainer.steps=1", "reward.functions.test/always_raises=1.0")
    step = [r for r in read_metrics(tmp_path) if r["step"] == 1][0]
    assert step["reward/errors"] == 16 and step["reward/timeouts"] == 0  # 4 prompts x 4 samples
    assert step["reward/test/always_raises"] == 0.0


@pytest.mark.slow  # ~17 s; split pools in the default run: test_ppo_e2e.py, tests/controller/test_controller_ray.py
@pytest.mark.ray  # the session's Ray instance (tests/conftest.py), which the run leaves up
def test_split_placement_on_ray_scores_on_its_own_pool(model_dir, tmp_path):
    """Two steps on Ray: actor+rollout on 'main' (2 data-parallel ranks), reward+reference on
    'aux' (1 rank); old logprobs recomputed by the actor: three scoring futures in flight at
    once. (Covers the plain 2-worker Ray run too: same main pool, more roles beside it.)"""
    import ray

    run(model_dir, tmp_path, "trainer.steps=2", "placement.backend=ray", "placement.world_size=2",
        "placement.threads_per_worker=1", "placement.pools.aux=1", "placement.roles.reward=aux",
        "placement.roles.reference=aux", "algo.kl_coef=0.01", "algo.recompute_old_logprobs=true")
    steps = [r for r in read_metrics(tmp_path) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert "actor/grad_norm" in steps[0] and "actor/kl" in steps[0] and "timing/score_s" in steps[0]
    assert ray.is_initialized()  # close_run stops only a Ray that the run's own pool started
    # on-policy and recomputed by the trainer: the PPO ratio starts at exactly ~1
    assert steps[0]["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_placement_errors_name_the_problem(model_dir, tmp_path):
    from baton.config import ConfigError
    with pytest.raises(ConfigError, match="rollout needs a pool of its own"):  # (apart: tests/trainers/test_async.py)
        run(model_dir, tmp_path, "trainer.mode=one_step_off", "placement.roles.rollout=main")
    with pytest.raises(ConfigError, match="undefined pool"):
        run(model_dir, tmp_path, "placement.roles.reward=elsewhere")
    with pytest.raises(ConfigError, match="unknown role"):
        run(model_dir, tmp_path, "placement.roles.critic=main")
