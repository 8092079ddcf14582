"""A run dir damaged between runs, on resume (issue 50.7): a metrics.jsonl cut mid-file and a
config.yaml cut at a line boundary are one line, exit 2, before the model loads, saying how
to recover (before: a traceback; the torn config's ~80 absent keys reported as "changes"
with advice to pass trainer.resume_changes=allow, which would resume on the torn file)."""

from __future__ import annotations

import pytest
from runs_helpers import REPO

from baton.cli import main

MODEL = str(REPO / "checkpoints/arith-sft")
TINY = ["data.prompts_per_step=2", "rollout.n=2", "actor.mini_batch_size=4", "actor.micro_batch_size=4",
        "data.eval_size=2", "trainer.eval_every=0", "trainer.progress=false", "placement.auto=false"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 2-step run with a checkpoint at each step: the dir the damages are made to (copies)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", str(REPO / "recipes/grpo_arithmetic.yaml"), f"model.path={MODEL}", *TINY,
                 f"trainer.run_dir={run_dir}", "trainer.steps=2", "trainer.save_every=1"]) == 0
    return run_dir


def resume(run_dir, *extra) -> int:
    return main(["train", str(REPO / "recipes/grpo_arithmetic.yaml"), f"model.path={MODEL}", *TINY,
                 f"trainer.run_dir={run_dir}", "trainer.steps=3", "trainer.resume=auto", *extra])


def copy(finished, tmp_path):
    import shutil

    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


def one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.strip()]
    assert len(err) == 1, err
    return err[0]


def test_a_metrics_file_cut_mid_file_is_one_line_exit_2(finished, tmp_path, capsys):
    run_dir = copy(finished, tmp_path)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][:len(lines[1]) // 2] + "\n"  # line 2 of 3 torn: not the last line
    (run_dir / "metrics.jsonl").write_text("".join(lines))
    capsys.readouterr()
    assert resume(run_dir) == 2
    err = one_line(capsys)
    assert err.startswith("baton: error: ") and "metrics.jsonl: line 2 of 3 is not a JSON object" in err, err
    assert "trainer.overwrite=true" in err


def test_a_config_yaml_cut_at_a_line_boundary_is_torn_not_changes(finished, tmp_path, capsys):
    run_dir = copy(finished, tmp_path)
    text = (run_dir / "config.yaml").read_text()
    lines = text.splitlines(keepends=True)
    (run_dir / "config.yaml").write_text("".join(lines[:len(lines) // 2]))  # still parses
    capsys.readouterr()
    assert resume(run_dir) == 2
    err = one_line(capsys)
    assert f"{run_dir / 'config.yaml'}: is torn" in err and "resume_changes" not in err, err
    assert "delete it to resume" in err
    (run_dir / "config.yaml").write_text(text)  # restored: the run resumes
    assert resume(run_dir) == 0
