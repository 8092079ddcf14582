"""docs/EXTENDING.md's worked examples (examples/extending/), run as a user runs them: files in
the working directory, `baton` started there with no PYTHONPATH=. (the subprocesses' path holds
only the repository, for `baton` itself), against a real tiny model."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from baton.models.make import make_tiny_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "extending"
TINY = ["data.prompts_per_step=4", "data.eval_size=4", "rollout.n=4", "rollout.max_new_tokens=4",
        "actor.micro_batch_size=8", "actor.mini_batch_size=8", "trainer.progress=false",
        "placement.threads_per_worker=1"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


@pytest.fixture
def user_dir(tmp_path):
    """A user's working directory holding the three example modules."""
    for f in EXAMPLES.glob("*.py"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def baton(cwd, *args, timeout=300):
    """`baton ARGS` in `cwd` as the installed console script runs it: a script in another
    directory (its sys.path starts there, not at the working directory, unlike `python -m`)."""
    script = Path(cwd).parent / "bin" / "baton"
    script.parent.mkdir(exist_ok=True)
    script.write_text("import sys\nfrom baton.cli import main\nsys.exit(main())\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("BATON_USER_PATH", None)
    return subprocess.run([sys.executable, str(script), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_doc_shows_the_example_files_as_they_are():
    doc = (REPO / "docs" / "EXTENDING.md").read_text()
    for name in ("my_rewards.py", "my_task.py", "my_env.py"):
        assert (EXAMPLES / name).read_text() in doc, name


def test_train_on_a_user_task_with_a_user_reward(user_dir, model_dir):
    """The driver imports my_task (data.task) and both rewards; the reward worker processes
    load them too (sandbox=process, as a user's run does)."""
    run = baton(user_dir, "train", REPO / "recipes/grpo_arithmetic.yaml", f"model.path={model_dir}", *TINY,
                "trainer.steps=1", "trainer.run_dir=run", "data.task=my_task:ModSumTask",
                'reward.functions={"my_task:correct": 1.0, "my_rewards:short_answer": 0.1}')
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(ln) for ln in (user_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r["step"] == 1][0]
    assert "reward/mean" in step and step.get("reward/errors", 0) == 0, step


def test_eval_on_a_user_task(user_dir, model_dir):
    run = baton(user_dir, "eval", model_dir, "--task", "my_task:ModSumTask", "--n", "4", "--max-new-tokens", "3")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "greedy   accuracy" in run.stdout and "on 4 held-out prompts" in run.stdout


def test_a_missing_user_module_is_one_line(user_dir, model_dir, capsys):
    run = baton(user_dir, "eval", model_dir, "--task", "nosuchmod:Task", "--n", "4")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "no module 'nosuchmod'" in run.stderr
    from baton.cli import main

    for override in ('reward.functions={"nosuchmod:fn": 1.0}', "data.task=nosuchmod:Task"):
        assert main(["train", "recipes/grpo_arithmetic.yaml", override, f"trainer.run_dir={user_dir / 'run'}"]) == 2
        err = capsys.readouterr().err
        assert "no module 'nosuchmod'" in err and err.count("\n") == 1, err


def test_a_user_environment_collects_a_group(user_dir, model_dir, monkeypatch):
    from baton.envs import make_environment
    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.services.env_runner import parse_env_args
    from baton.user_modules import add_user_path

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # restored after the test
    monkeypatch.setenv("BATON_USER_PATH", "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("my_env", "my_task"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    add_user_path(user_dir)  # what `baton env` does first with its working directory
    args = parse_env_args(["--env", "my_env:ModSumEnvironment", "--api", "http://x", "--server", "http://y"])
    tok = load_tokenizer(model_dir)
    env = make_environment(args.name, tok, group_size=3, seed=0)
    env.setup()
    group = env.collect(env.next_item(), EmbeddedEngine(load_model(model_dir), tok))
    assert len(group.scores) == 3 and all(s <= 1.0 for s in group.scores)
    assert type(env).__name__ == "ModSumEnvironment" and env.task.name == "modsum"
    with pytest.raises(SystemExit):
        parse_env_args(["--api", "http://x", "--server", "http://y"])  # no environment named


@pytest.mark.slow  # ~30 s: starts a Ray instance of its own
def test_train_on_a_user_task_under_ray(user_dir, model_dir):
    """Ray workers import the user's task themselves (the issue: "unknown task" there)."""
    run = baton(user_dir, "train", REPO / "recipes/grpo_arithmetic.yaml", f"model.path={model_dir}", *TINY,
                "trainer.steps=1", "trainer.run_dir=run", "data.task=my_task:ModSumTask",
                'reward.functions={"my_task:correct": 1.0}', "placement.backend=ray", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert any(json.loads(ln)["step"] == 1 for ln in (user_dir / "run" / "metrics.jsonl").read_text().splitlines())


def test_the_doc_s_task_commands_run_sft_then_train_then_eval(user_dir):
    """Part 2's sh block as written ($BATON = the checkout), 2 steps each: `baton sft` on the
    user task (refused before: "data.task='my_task:ModSumTask' is not one of [...]"), GRPO from
    its checkpoint, eval of the GRPO checkpoint."""
    import re
    import shlex

    doc = (REPO / "docs" / "EXTENDING.md").read_text()
    block = re.search(r"Warm-start a model on it.*?```sh\n(.*?)```", doc, re.S).group(1)
    commands = [shlex.split(c.replace("$BATON", str(REPO))) for c in block.replace("\\\n", " ").splitlines()]
    assert [c[:2] for c in commands] == [["baton", "sft"], ["baton", "train"], ["baton", "eval"]]
    fast = {"sft": ["trainer.steps=2", "trainer.batch_size=4", "data.eval_size=4", "data.eval_samples=1",
                    "trainer.progress=false", "model.overrides={layers: 1}"],
            "train": [*TINY, "trainer.steps=2"], "eval": ["--n", "4", "--max-new-tokens", "3"]}
    for argv in commands:
        argv = [a.replace("step_180", "step_2").replace("step_300", "step_2") for a in argv[1:]]
        run = baton(user_dir, *argv, *fast[argv[0]])
        assert run.returncode == 0, (argv, run.stderr[-3000:])
    assert "on 4 held-out prompts" in run.stdout


def _doc_files() -> dict[str, str]:
    """docs/EXTENDING.md's section 4 and 5 blocks, by the file name on their first line."""
    import re

    doc = (REPO / "docs" / "EXTENDING.md").read_text()
    return {m[1]: m[2] for m in re.finditer(r"```python\n# (my_\w+\.py)\n(.*?)```", doc, re.S)}


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """The doc's row source, estimator and engine as files, imported (so registered); the
    registries put back afterwards."""
    import importlib

    from baton.algos.advantages import ADVANTAGES, NEEDS
    from baton.rollout.engines import ENGINES
    from baton.sources import SOURCES
    from baton.sync.registry import TRANSPORTS

    files = {name: text for name, text in _doc_files().items() if name != "my_role.py"}  # section 5: its own test
    assert set(files) == {"my_source.py", "my_estimator.py", "my_engine.py", "my_transport.py"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = [importlib.import_module(n.removesuffix(".py")) for n in sorted(files)]
    yield modules
    for registry, name in ((SOURCES, "counting"), (ADVANTAGES, "sign_grpo"), (NEEDS, "sign_grpo"),
                           (ENGINES, "counting"), (TRANSPORTS, ("counting_copy", "colocated"))):
        dict.pop(registry, name, None)
    for name in files:
        sys.modules.pop(name.removesuffix(".py"), None)


def test_a_new_row_source_estimator_engine_and_transport_train(registered, model_dir, tmp_path):
    """One file each plus its registration: the config accepts the names, the driver builds
    the source, the engine and the weight sync through their registries and passes the
    estimator what it declares."""
    from baton.config import ConfigError, load_config
    from baton.metrics import read_metrics
    from baton.trainers import ppo
    from baton.trainers.ppo_config import PPOConfig

    my_engine = next(m for m in registered if m.__name__ == "my_engine")
    my_transport = next(m for m in registered if m.__name__ == "my_transport")
    base = [f"model.path={model_dir}", *TINY, "data.source=counting", "algo.advantage=sign_grpo",
            "rollout.engine=counting", "rollout.weight_sync=counting_copy", "placement.auto=false"]
    cfg = load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml",
                      [*base, "trainer.steps=2", f"trainer.run_dir={tmp_path / 'run'}", "algo.dynamic_sampling=true"])
    assert cfg.source.draws_more and "reward" in cfg.roles
    ppo.train(cfg)
    steps = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert [s["counting/rows"] for s in steps][-1] >= 2 * 16  # 4 prompts x 4 samples a step (more: DAPO draws)
    assert my_engine.CountingEngine.calls > 0
    assert my_transport.CountingCopy.pushes >= 2  # the engine's own copy filled at start and after each update
    with pytest.raises(ConfigError, match="rollout.n=1"):  # sign_grpo declared group_index: it compares samples
        load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml", [*base, "rollout.n=1", "actor.mini_batch_size=4",
                                                                       "actor.micro_batch_size=4"])


@pytest.fixture
def user_role(tmp_path, monkeypatch):
    """The doc's role (section 5) as a file, imported (so registered); ROLES put back afterwards."""
    import importlib

    from baton.trainers.role_specs import ROLES

    (tmp_path / "my_role.py").write_text(_doc_files()["my_role.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("my_role")
    dict.pop(ROLES, "judge", None)
    sys.modules.pop("my_role", None)


def test_a_new_role_is_built_scored_and_added_to_the_reward(user_role, model_dir, tmp_path):
    """One file: the config lists the role, the placement builds its worker, the step calls it
    on every step's rows (DAPO's sampling too: it scores the reward) and its declared
    reward term reaches the reward."""
    from baton.config import load_config
    from baton.metrics import read_metrics
    from baton.trainers import ppo
    from baton.trainers.ppo_config import PPOConfig

    cfg = load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml",
                      [f"model.path={model_dir}", *TINY, "placement.auto=false", "trainer.steps=2",
                       f"trainer.run_dir={tmp_path / 'run'}", "data.eval_size=2"])
    assert cfg.roles[-1] == "judge" and cfg.scored
    ppo.train(cfg)
    steps = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0 and "reward/mean" in r]
    assert len(steps) == 2 and user_role.BrevityJudge.calls == 2
    for m in steps:  # the task reward (weight 1) plus the judge's column, row by row, so in the mean
        assert m["reward/brevity"] < 0
        assert m["reward/mean"] == pytest.approx(m["reward/arithmetic/correct"] + m["reward/brevity"], abs=1e-6)
