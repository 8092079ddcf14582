"""`data.task: verifiers` (baton/envs/verifiers_task.py): a verifiers taskset (recipes/envs/
vf_sums.py, written as a user would) becomes rows, held-out tasks never trained on, and the
task's own `@vf.reward` functions are the reward and the verifier; the recipe runs 2 steps
(marker `envs_extra`). Without the extra: tests/envs/test_missing_extras.py."""

from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes/envs/grpo_verifiers.yaml"
ARGS = {"taskset": "recipes.envs.vf_sums", "taskset_args": {"n": 200}}


@pytest.fixture(autouse=True)
def _repo_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.chdir(REPO)


def test_tasks_become_rows_heldout_disjoint():
    from baton.envs import configured_task

    task = configured_task("verifiers", ARGS)
    train, held = task.train_rows(seed=0), task.eval_rows(200)
    assert train == task.train_rows(seed=0) and train != task.train_rows(seed=1)  # shuffled by the seed
    assert len(train) + len(held) == 200 and held
    assert not {r["vf_index"] for r in train} & {r["vf_index"] for r in held}
    r = train[0]
    assert r["prompt"].endswith("=") and str(eval(r["prompt"][:-1])) == r["answer"]  # noqa: S307


def test_reward_is_the_tasks_own_scoring():
    from baton.envs import configured_task
    from baton.envs.verifiers_task import load_tasks
    from baton.rewards.runner import REWARD_FUNCTIONS

    task = configured_task("verifiers", ARGS)
    row = task.eval_rows(1)[0]
    kw = {k: v for k, v in row.items() if k != "prompt"}
    fn = REWARD_FUNCTIONS["verifiers/reward"]
    assert fn(row["prompt"], row["answer"], **kw) == 1.0 and task.is_correct(row["answer"] + "<eos>", row)
    assert fn(row["prompt"], row["answer"] + "0", **kw) == 0.0 and not task.is_correct("x", row)
    # a fresh process would load the taskset from the row alone: the same task at vf_index
    load_tasks.cache_clear()
    assert fn(row["prompt"], row["answer"], **kw) == 1.0


@pytest.mark.parametrize("args,match", [
    ({}, "needs data.task_args.taskset"),
    ({"taskset": "no_such_taskset_here"}, "no_such_taskset_here"),
    ({"taskset": "recipes.envs.vf_sums", "taskset_args": {"n": 0}}, "has no tasks"),
    ({"taskset": "recipes.envs.vf_sums", "taskset_args": {"bogus": 1}}, "bogus"),
])
def test_bad_task_args_refused(args, match):
    from baton.config import ConfigError, load_config
    from baton.trainers.ppo_config import PPOConfig

    with pytest.raises(ConfigError, match=match):
        load_config(PPOConfig, RECIPE, [f"data.task_args={args}"])


def test_a_taskset_that_fails_to_import_is_one_line_with_its_own_error(tmp_path, monkeypatch):
    """Issue 50.10: reported under taskset_args, the message repeated, without the error's
    type or file:line."""
    from baton.config import ConfigError, load_config
    from baton.trainers.ppo_config import PPOConfig

    (tmp_path / "vf_broken_pkg").mkdir()
    (tmp_path / "vf_broken_pkg/__init__.py").write_text("")
    module = tmp_path / "vf_broken_pkg/sums.py"
    module.write_text("import verifiers.v1 as vf\nraise RuntimeError('no API key in the environment')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        load_config(PPOConfig, RECIPE, ["data.task_args={taskset: vf_broken_pkg.sums}"])
    msg = str(e.value)
    assert "data.task_args.taskset='vf_broken_pkg.sums': importing it failed: RuntimeError: no API key in the " \
           f"environment ({module}:2)" in msg and "taskset_args" not in msg, msg


@pytest.mark.envs_extra
def test_recipe_runs_two_steps(tmp_path):
    from .recipe_runs import two_steps

    steps = two_steps(RECIPE, tmp_path)
    # every call scored: verifiers' import (seconds) runs as a reward worker starts, not in a
    # call under its 5 s deadline (where it timed out in every fresh worker: all rewards 0)
    assert all(s["reward/timeouts"] == 0 and s["reward/errors"] == 0 for s in steps), steps
