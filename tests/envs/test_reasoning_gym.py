"""`data.task: reasoning_gym` (baton/envs/reasoning_gym_task.py): rows from reasoning-gym's
generators under the run's seed, train and held-out questions disjoint, its `score_answer` as
the reward and the verifier; the recipes run 2 steps (marker `envs_extra`: CI's extras job).
Without the extra: tests/envs/test_missing_extras.py."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EASY = {"basic_arithmetic": {"weight": 1.0, "operators": ["+"], "min_terms": 2, "max_terms": 3, "min_digits": 1,
                             "max_digits": 1, "allow_parentheses": False, "allow_negation": False}}


pytest.importorskip("reasoning_gym")


@pytest.fixture(scope="module")
def task():
    from baton.envs import configured_task

    return configured_task("reasoning_gym", {"datasets": EASY})


def test_rows_seeded_and_heldout_disjoint(task):
    train = task.train_rows(2000, seed=1)
    assert train == task.train_rows(2000, seed=1) and train != task.train_rows(2000, seed=2)
    held = {r["prompt"] for r in task.eval_rows(200)}
    assert len(held) > 20
    for seed in (0, 1, 2):  # whatever the run's seed, no held-out question is trained on
        assert not held & {r["prompt"] for r in task.train_rows(2000, seed=seed)}
    r = train[0]
    assert r["dataset"] == "basic_arithmetic" and r["prompt"].startswith("Calculate ")
    assert str(eval(r["prompt"][len("Calculate "):-1])) == r["answer"]  # noqa: S307 - the generator's own sum


def test_weights_mix_datasets():
    from baton.envs import configured_task

    t = configured_task("reasoning_gym", {"datasets": {**EASY, "chain_sum": {"weight": 3.0, "max_digits": 1}}})
    rows = t.train_rows(800, seed=0)
    share = sum(r["dataset"] == "chain_sum" for r in rows) / len(rows)
    assert abs(share - 0.75) < 0.06  # 3:1 by weight (binomial sd ~0.015)


def test_reward_and_verifier_are_score_answer(task):
    import reasoning_gym

    from baton.rewards.runner import REWARD_FUNCTIONS

    row = task.eval_rows(1)[0]
    fn = REWARD_FUNCTIONS["reasoning_gym/score"]
    kw = {k: v for k, v in row.items() if k != "prompt"}
    entry = {"question": row["prompt"], "answer": row["answer"], "metadata": {}}
    own = reasoning_gym.get_score_answer_fn("basic_arithmetic")
    for completion, answer in [(row["answer"], row["answer"]), (f"<answer>{row['answer']}</answer>", row["answer"]),
                               (row["answer"] + "<eos>", row["answer"]), ("x", "x"), ("", "")]:
        assert fn(row["prompt"], completion, **kw) == own(answer, entry)
    assert fn(row["prompt"], row["answer"], **kw) == 1.0 and task.is_correct(row["answer"], row)
    assert fn(row["prompt"], "999", **kw) == 0.0 and not task.is_correct("999", row)


@pytest.mark.parametrize("args,match", [
    ({}, "needs data.task_args.datasets"),
    ({"datasets": {"no_such_set": 1.0}}, "'no_such_set' is not a reasoning-gym dataset"),
    ({"datasets": {"basic_arithmetic": 0}}, "weight must be a number > 0"),
    ({"datasets": {"basic_arithmetic": {"seed": 3}}}, "set by baton"),
    ({"datasets": {"basic_arithmetic": {"no_key": 3}}}, "basic_arithmetic"),
    ({"datasets": EASY, "nope": 1}, "nope"),
])
def test_bad_task_args_refused(args, match):
    from baton.config import ConfigError, load_config
    from baton.trainers.ppo_config import PPOConfig

    with pytest.raises(ConfigError, match=match):
        load_config(PPOConfig, REPO / "recipes/envs/grpo_reasoning_gym.yaml", [f"data.task_args={args}"])


def test_task_args_refused_for_a_task_without_them():
    from baton.config import ConfigError, load_config
    from baton.trainers.ppo_config import PPOConfig

    with pytest.raises(ConfigError, match="takes no arguments"):
        load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml", ["data.task_args={size: 3}"])


@pytest.mark.envs_extra
def test_recipes_run_two_steps(tmp_path, monkeypatch):
    """The SFT warm start then GRPO, 2 steps each (what a fresh clone with the extra runs)."""
    from baton.cli import main

    monkeypatch.chdir(REPO)
    model = tmp_path / "sft-model"
    assert main(["train", "recipes/envs/sft_reasoning_gym.yaml", "trainer.steps=2", f"trainer.run_dir={tmp_path}/sft",
                 f"trainer.save_path={model}", "data.eval_size=4", "data.num_examples=64",
                 "trainer.progress=false"]) == 0
    assert main(["train", "recipes/envs/grpo_reasoning_gym.yaml", "trainer.steps=2", f"trainer.run_dir={tmp_path}/grpo",
                 f"model.path={model}", "data.prompts_per_step=4", "data.eval_size=4", "actor.mini_batch_size=0",
                 "actor.micro_batch_size=32", "trainer.progress=false"]) == 0
    from baton.metrics import read_metrics

    steps = [r for r in read_metrics(tmp_path / "grpo") if "actor/loss" in r]
    assert len(steps) == 2 and all(0 <= s["reward/mean"] <= 1 for s in steps)
