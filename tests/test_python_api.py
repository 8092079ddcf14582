"""`baton.train` (baton/python_api.py): the same run as `baton train`, from a plain script; rewards
as Python callables (per row, batched TRL-style, async), rows as Python objects, a callable sent
to a Ray worker or refused in one line, and the result's model generating."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import baton
import baton.envs  # noqa: F401  (registers arithmetic/format)
from baton.config import ConfigError
from baton.data.inline import rows_file
from baton.data.records import DataError
from baton.metrics import read_metrics
from baton.rewards.python import PYTHON_REWARDS, register_callables
from baton.rewards.runner import RewardRunner

REPO = Path(__file__).resolve().parents[1]
SMALL = {"data.prompts_per_step": 8, "data.eval_size": 8, "rollout.n": 4, "actor.mini_batch_size": 32,
         "actor.micro_batch_size": 32, "trainer.progress": False, "trainer.eval_every": 0}
ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
# what arithmetic/correct computes, as a user writes it
SCRIPT = """\
import json, sys
import baton
import baton.envs  # noqa: F401  (registers arithmetic/format)
rows = json.load(open(sys.argv[1]))
run = baton.train("recipes/grpo_arithmetic.yaml", overrides=json.loads(sys.argv[2]),
                  reward_funcs=[lambda completion, answer, **_: float(completion.split("<eos>")[0].strip() == answer)],
                  train_dataset=rows)
print("held-out accuracy", run.accuracy)
"""
COMPARED = ("reward/mean", "reward/std", "actor/loss", "actor/grad_norm", "actor/entropy", "actor/clip_frac",
            "response/length_mean", "eval/accuracy_greedy", "eval/accuracy_sampled")


@pytest.fixture(autouse=True)
def _rows_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BATON_ROWS_CACHE", str(tmp_path / "rows"))


def _env(tmp_path: Path) -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "BATON_ROWS_CACHE": str(tmp_path / "rows")}


def test_a_script_and_the_cli_take_the_same_first_steps(tmp_path):
    """Golden: a few lines of Python (a lambda reward, a list of dicts) and `baton train` with the
    same rows in a file, the same seed: the same metrics at steps 0-2, to the last bit."""
    data = tmp_path / "rows.json"
    data.write_text(json.dumps(ROWS))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "script.py").write_text(SCRIPT)
    common = {**SMALL, "trainer.steps": 2}
    py = subprocess.run([sys.executable, str(tmp_path / "script.py"), str(data),
                         json.dumps({**common, "trainer.run_dir": str(tmp_path / "py")})],
                        cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert py.returncode == 0, py.stderr[-3000:]
    assert "held-out accuracy 0." in py.stdout or "held-out accuracy 1.0" in py.stdout, py.stdout
    cli = subprocess.run([sys.executable, "-m", "baton.cli", "train", "recipes/grpo_arithmetic.yaml",
                          *(f"{k}={json.dumps(v)}" for k, v in common.items()), f"trainer.run_dir={tmp_path / 'cli'}",
                          f"data.path={tmp_path / 'rows.jsonl'}"],
                         cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    a, b = read_metrics(tmp_path / "py"), read_metrics(tmp_path / "cli")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2]
    assert "reward/python/lambda" in a[1] and "reward/arithmetic/correct" in b[1]
    for ra, rb in zip(a, b):
        shared = [k for k in COMPARED if k in ra or k in rb]
        assert shared and {k: ra.get(k) for k in shared} == {k: rb.get(k) for k in shared}, ra["step"]


def test_reward_shapes_per_row_batched_async():
    def per_row(completion, answer):  # only the fields it names
        return float(completion == answer)

    def batched(prompts, completions, answer, **kwargs):  # TRL's shape
        return [0.5 * (c == a) for c, a in zip(completions, answer)]

    async def later(prompt, completion, **row):
        return 0.25

    names = register_callables({per_row: 1.0, batched: 2.0, later: 1.0, "arithmetic/format": 1.0})
    assert list(names) == ["python/per_row", "python/batched", "python/later", "arithmetic/format"]
    with RewardRunner(names, sandbox="thread", max_workers=2) as runner:
        totals, per_fn, stats = runner.score(["1+1=", "2+2="], ["2", "5"], [{"answer": "2"}, {"answer": "4"}])
    assert per_fn == {"python/per_row": [1.0, 0.0], "python/batched": [0.5, 0.0], "python/later": [0.25, 0.25],
                      "arithmetic/format": [1.0, 1.0]}
    assert totals == [1.0 + 1.0 + 0.25 + 1.0, 0.25 + 1.0] and sum(stats.errors) == 0
    again = register_callables([lambda completion, **_: 0.0, lambda completion, **_: 1.0])
    assert list(again) == ["python/lambda", "python/lambda_2"] and PYTHON_REWARDS["python/lambda_2"](
        prompt="p", completion="c") == 1.0


class RowsLike:
    """A `datasets.Dataset` as baton sees it (datasets is not installed here; rows_file never imports it)."""

    def __init__(self, rows):
        self.rows = rows

    def to_list(self):
        return list(self.rows)


def test_rows_as_python_objects(tmp_path):
    path = rows_file(ROWS[:5], "train_dataset")
    assert rows_file(RowsLike(ROWS[:5]), "train_dataset") == path  # same rows, same file
    assert rows_file(iter(ROWS[:5]), "train_dataset") == path
    assert [json.loads(line)["prompt"] for line in Path(path).read_text().splitlines()] == [
        r["prompt"] for r in ROWS[:5]]
    assert rows_file(str(tmp_path / "x.jsonl")) == str(tmp_path / "x.jsonl")  # a path as it is
    written = set((tmp_path / "rows").iterdir())
    with pytest.raises(DataError, match=r"^train_dataset row 2: no 'prompt'"):
        rows_file([ROWS[0], {"text": "no prompt"}], "train_dataset")
    with pytest.raises(DataError, match=r"^train_dataset row 1: not JSON-serialisable"):
        rows_file([{"prompt": "1+1=", "answer": {1, 2}}], "train_dataset")
    with pytest.raises(DataError, match="a path, a list of dicts"):
        rows_file({"prompt": "1+1="}, "train_dataset")
    assert set((tmp_path / "rows").iterdir()) == written  # nothing written for bad rows


def test_bad_input_is_one_line_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="reward.functions is given twice"):
        baton.train("recipes/grpo_arithmetic.yaml", overrides={"reward.functions": {"arithmetic/correct": 1}},
                    reward_funcs=[lambda completion, **_: 1.0])
    with pytest.raises(ConfigError, match="unknown config key 'trainer.stepz'"):
        baton.train({"model": {"path": "checkpoints/arith-sft"}}, overrides={"trainer.stepz": 1,
                                                                             "trainer.run_dir": str(tmp_path / "r")})
    assert not (tmp_path / "r").exists()


@pytest.mark.ray
def test_a_lambda_reaches_a_ray_worker_or_is_refused(tmp_path):
    lock = threading.Lock()
    with pytest.raises(ConfigError, match=r"reward function 'python/held' cannot be sent to Ray worker processes "
                                          r"\(placement.backend=ray\): TypeError: .*lock"):
        def held(completion, **_):
            with lock:
                return 1.0
        baton.train("recipes/grpo_arithmetic.yaml", reward_funcs=[held],
                    overrides={**SMALL, "trainer.steps": 1, "trainer.run_dir": str(tmp_path / "no"),
                               "placement.backend": "ray", "placement.world_size": 1})
    assert not (tmp_path / "no").exists()
    run = baton.train("recipes/grpo_arithmetic.yaml", reward_funcs=[lambda completion, **_: 0.375],
                      overrides={**SMALL, "trainer.steps": 1, "trainer.run_dir": str(tmp_path / "ray"),
                                 "placement.backend": "ray", "placement.world_size": 1})
    step = read_metrics(run.run_dir)[1]
    assert step["reward/python/lambda"] == 0.375 and step["reward/errors"] == 0


def test_the_result_generates_and_evaluates(tmp_path):
    run = baton.train("recipes/grpo_arithmetic.yaml", train_dataset=ROWS,
                      overrides={**SMALL, "trainer.steps": 1, "trainer.run_dir": str(tmp_path / "run")})
    assert run.run_dir == tmp_path / "run" and run.checkpoint.name == "step_1"
    assert run.accuracy == run.metrics["eval/accuracy_greedy"] and run.start_accuracy is not None
    assert [r["step"] for r in run.history()] == [0, 1]
    out = run.generate(["2+3=", "4+4="])
    assert len(out) == 2 and all(isinstance(t, str) for t in out)
    assert run.evaluate()["eval/accuracy_greedy"] == run.accuracy  # the run's held-out rows, greedy
    assert run.tokenizer is not None and sum(p.numel() for p in run.model.parameters()) > 0



def test_a_typed_config_is_a_recipe(tmp_path):
    """A config object (what `load_config` builds, changed in Python) runs as its recipe would."""
    from baton.config import load_config
    from baton.trainers.ppo_config import PPOConfig

    cfg = load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml",
                      [f"{k}={json.dumps(v)}" for k, v in SMALL.items()])
    cfg.trainer.steps, cfg.trainer.run_dir = 1, str(tmp_path / "typed")
    run = baton.train(cfg, reward_funcs={"arithmetic/correct": 1.0, lambda completion, **_: 0.5: 0.5})
    assert run.config.trainer.steps == 1 and run.config.actor.lr == cfg.actor.lr
    step = read_metrics(run.run_dir)[1]
    assert step["reward/python/lambda"] == 0.5 and "reward/arithmetic/correct" in step
