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


@pytest.mark.parametrize("damage,says", [
    ("deleted", "has no line for 2 of the 2 steps the checkpoint covers (steps 1-2)"),
    ("torn-last", "has no line for 1 of the 2 steps the checkpoint covers (steps 2)"),
])
def test_metrics_lines_the_checkpoint_covers_but_lost_are_said_at_resume(finished, tmp_path, capsys, damage, says):
    """Issue 50.8: a deleted metrics.jsonl, or the last step's line torn beside its complete
    checkpoint (the line is now fsynced before the checkpoint is saved), resumed silently."""
    run_dir = copy(finished, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    if damage == "deleted":
        metrics.unlink()
    else:
        text = metrics.read_text()
        metrics.write_text(text[:len(text) - 20])  # the step-2 line torn mid-way
    capsys.readouterr()
    assert resume(run_dir) == 0
    assert f"baton: {metrics} {says}" in capsys.readouterr().out


def test_a_torn_data_files_json_is_said_and_written_anew(tmp_path, capsys):
    """Issue 50.8: a torn data_files.json was never rewritten, so a later rewrite of the data
    resumed silently on other rows, for good."""
    data, run_dir = tmp_path / "d.jsonl", tmp_path / "run"
    data.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(20)))
    argv = ["train", str(REPO / "recipes/grpo_arithmetic.yaml"), f"model.path={MODEL}", *TINY, f"data.path={data}",
            f"trainer.run_dir={run_dir}", "trainer.save_every=1"]
    assert main([*argv, "trainer.steps=1"]) == 0
    (run_dir / "data_files.json").write_text('{"data.path": {"pa')
    capsys.readouterr()
    assert main([*argv, "trainer.steps=2", "trainer.resume=auto"]) == 0
    assert f"{run_dir / 'data_files.json'} is torn" in capsys.readouterr().out
    data.write_text(data.read_text().replace('"1+1="', '"1+9="'))  # rewritten in place: now refused
    assert main([*argv, "trainer.steps=3", "trainer.resume=auto"]) == 1
    assert f"data.path={data} changed since the run started" in capsys.readouterr().err
