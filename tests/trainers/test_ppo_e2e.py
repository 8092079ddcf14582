"""Whole PPO-family runs on a tiny random model: PPO with a critic (GAE, KL in the reward with
the adaptive controller, truncated IS, critic warm-up), exact resume including the critic and
the KL controller, the critic-less family (ReMax, DAPO dynamic sampling + overlong penalty,
GSPO), one-line config errors through `baton train`, and split placement on Ray where the
actor's and the critic's updates overlap (read back from timeline.jsonl)."""

import json

import pytest

from baton.cli import main
from baton.config import ConfigError, load_config
from baton.metrics import read_metrics
from baton.models.make import make_tiny_checkpoint
from baton.trainers.session import timeline
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig
from baton.workers.reward_model import load_reward_model

TINY = ["data.prompts_per_step=4", "data.eval_size=8", "rollout.n=4", "rollout.max_new_tokens=6",
        "actor.micro_batch_size=8", "actor.mini_batch_size=8", "actor.lr=1e-3", "trainer.progress=false",
        "critic.micro_batch_size=8", "critic.mini_batch_size=8", "critic.lr=1e-4"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


@pytest.fixture(scope="module")
def rm_dir(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rm") / "rm"
    load_reward_model(model_dir, seed=5).save_pretrained(out)  # a random head: scores, untrained
    from baton.models.load import load_tokenizer
    load_tokenizer(model_dir).save_pretrained(out)
    return str(out)


def run(model_dir, run_dir, *extra, critic=True):
    base = [f"model.path={model_dir}", f"trainer.run_dir={run_dir}", *TINY]
    if not critic:
        base = [o for o in base if not o.startswith("critic.")]
        base += ["critic=null", "algo.advantage=grpo"]
    cfg = load_config(PPOConfig, "recipes/ppo_arithmetic.yaml", [*base, *extra])
    return train(cfg)


def steps_of(run_dir):
    return [r for r in read_metrics(run_dir) if r["step"] > 0]


def test_ppo_with_critic_kl_in_reward_and_tis(model_dir, tmp_path):
    result = run(model_dir, tmp_path, "trainer.steps=3", "critic.pretrain_steps=1", "algo.kl_in_reward=true",
                 "algo.kl_controller=adaptive", "algo.kl_reward_coef=0.05", "algo.kl_target=0.001",
                 "algo.kl_horizon=16", "algo.recompute_old_logprobs=true", "algo.off_policy=tis",
                 "trainer.check_weight_sync=true")
    s1, s2, s3 = steps_of(tmp_path)
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/explained_var", "critic/value_mean",
                "critic/grad_norm", "kl_reward/kl", "kl_reward/coef", "off_policy/mismatch_kl",
                "off_policy/capped_frac", "timing/update_s"):
        assert key in s1 and key in s3, key
    assert "actor/loss" not in s1 and "actor/loss" in s2  # the critic's warm-up step
    assert s1["kl_reward/coef"] == 0.05 and s2["kl_reward/coef"] != 0.05  # adapted
    assert s1["off_policy/mismatch_kl"] < 1e-6  # fp32 engine = trainer
    assert "eval/accuracy_greedy" in result and "start/eval/accuracy_greedy" in result
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "step_3" / "trainer_state.pt").exists()
    assert (ckpts / "critic_step_3" / "critic_state.pt").exists()
    recs = timeline.read(tmp_path / "timeline.jsonl")
    assert {r["step"] for r in recs} == {1, 2, 3}
    s2_calls = {(r["role"], r["method"]) for r in recs if r["step"] == 2}
    assert {("actor", "update"), ("critic", "update_critic"), ("critic", "compute_values"),
            ("reference", "compute_ref_logprobs"), ("actor", "compute_logprobs")} <= s2_calls


@pytest.mark.slow  # ~7 s; exact resume in the default run: GRPO, DPO, the critic (tests/workers/test_critic.py)
def test_resume_gives_identical_next_step(model_dir, tmp_path):
    extra = ["critic.pretrain_steps=1", "algo.kl_in_reward=true", "algo.kl_controller=adaptive",
             "algo.kl_target=0.001", "algo.kl_horizon=16"]
    full, part = tmp_path / "full", tmp_path / "part"
    run(model_dir, full, "trainer.steps=3", "trainer.save_every=2", *extra)
    run(model_dir, part, "trainer.steps=2", *extra)
    run(model_dir, part, "trainer.steps=3", "trainer.resume=auto", *extra)
    a = [r for r in read_metrics(full) if r["step"] == 3]
    b = [r for r in read_metrics(part) if r["step"] == 3]
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/", "timeline/"))}
    assert drop(a[0]) == drop(b[0])
    assert "critic/vf_loss" in a[0] and "kl_reward/coef" in a[0]
    assert max(r["step"] for r in timeline.read(part / "timeline.jsonl")) == 3


@pytest.mark.parametrize("extra", [
    ["algo.advantage=remax"],
    ["algo.dynamic_sampling=true", "algo.dynamic_sampling_max_rounds=2", "algo.overlong_buffer=2"],
    ["algo.policy_loss=gspo", "algo.loss_agg=seq-mean-token-mean"],
    ["algo.advantage=rloo", "reward.functions={}", "reward_model.weight=0.5"],
])
def test_the_critic_less_family(model_dir, rm_dir, tmp_path, extra):
    if any(e.startswith("reward_model") for e in extra):
        extra = [*extra, f"reward_model.path={rm_dir}"]
    run(model_dir, tmp_path, "trainer.steps=2", *extra, critic=False)
    s1 = steps_of(tmp_path)[0]
    assert "actor/loss" in s1 and "critic/vf_loss" not in s1
    if "algo.dynamic_sampling=true" in extra:
        assert s1["dapo/groups_drawn"] >= 4 and s1["dapo/groups_kept"] + s1["dapo/groups_filled"] == 4
        assert "reward/overlong" in s1
    if "reward.functions={}" in extra:
        assert "reward/model" in s1 and s1["reward/mean"] == pytest.approx(0.5 * s1["reward/model"], abs=1e-5)


def test_config_errors_are_one_line(model_dir, tmp_path, capsys):
    def error(*overrides):
        code = main(["train", "recipes/ppo_arithmetic.yaml", f"model.path={model_dir}",
                     f"trainer.run_dir={tmp_path / 'never'}", *overrides])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        return err

    assert "needs values from a critic" in error("critic=null")  # gae without a critic
    assert "does not use values" in error("algo.advantage=grpo")  # a critic nothing reads
    assert "unknown config key" in error("algo.tis_cap=2.0")  # one off-policy mechanism: algo.off_policy
    assert "algo.gamma" in error("algo.gamma=1.5")
    assert "unknown role" in error("critic=null", "algo.advantage=grpo", "placement.pools.aux=1",
                                   "placement.roles.critic=aux")
    assert not (tmp_path / "never").exists()  # nothing written for a bad config
    with pytest.raises(ConfigError, match="kl_controller"):
        load_config(PPOConfig, "recipes/ppo_arithmetic.yaml", ["algo.kl_controller=pid"])


@pytest.mark.ray
def test_split_placement_runs_the_two_updates_at_once(model_dir, rm_dir, tmp_path):
    """actor + rollout + reward on 'main'; critic + reward model on 'critic': values, reference
    and rewards are scored concurrently, and update_actor || update_critic overlap."""
    run(model_dir, tmp_path, "trainer.steps=3", "critic.pretrain_steps=0", "placement.backend=ray",
        "placement.threads_per_worker=1",
        "placement.pools.critic=1", "placement.roles.critic=critic", "placement.roles.reward_model=critic",
        f"reward_model.path={rm_dir}", "reward_model.weight=0.1", "algo.kl_in_reward=true",
        "data.prompts_per_step=8", "actor.mini_batch_size=32", "critic.mini_batch_size=32",
        "actor.epochs=2", "critic.epochs=2")
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == [1, 2, 3] and "reward/model" in steps[0]
    recs = timeline.read(tmp_path / "timeline.jsonl")
    pids = {(r["role"], r["pid"]) for r in recs}
    assert {p for role, p in pids if role == "critic"}.isdisjoint({p for role, p in pids if role == "actor"})
    overlaps = [r["timeline/update_overlap"] for r in steps if "timeline/update_overlap" in r]
    assert overlaps and max(overlaps) > 0.5, overlaps
    print(json.dumps({"update_overlap": overlaps}))
