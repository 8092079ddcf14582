"""A resumed run reads the data its checkpoints saw (issue 38): the data files' size and
sha256 are recorded in RUN/data_files.json when the run starts; a resume whose file was
rewritten in place is refused in one line naming it (before the model loads), unless
trainer.resume_changes=allow, which says what changed and goes on; a file with another
number of rows than the checkpoint's sampler saw is one line, not a traceback.
"""

from __future__ import annotations

import json

import pytest
from runs_helpers import REPO

from baton.cli import main
from baton.runs.resume_checks import check_data_unchanged
from baton.runs.rundir import RunDirError

TINY = ["data.prompts_per_step=2", "data.eval_size=2", "rollout.n=2", "rollout.max_new_tokens=2",
        "actor.micro_batch_size=4", "actor.mini_batch_size=4", "trainer.progress=false", "trainer.eval_every=0",
        "placement.auto=false", "placement.threads_per_worker=1", "reward.max_workers=1",
        f"model.path={REPO / 'checkpoints/arith-sft'}"]


def write_rows(path, n: int, offset: int = 1) -> None:
    path.write_text("".join(json.dumps({"prompt": f"{i}+{offset}=", "answer": str(i + offset)}) + "\n"
                            for i in range(n)))


def test_fingerprints_are_recorded_then_compared(tmp_path):
    data = tmp_path / "d.jsonl"
    write_rows(data, 20)
    files = {"data.path": str(data)}
    assert check_data_unchanged(tmp_path, files, fresh=True, allow=False) == []
    assert check_data_unchanged(tmp_path, files, fresh=False, allow=False) == []  # unchanged: resumes
    write_rows(data, 20, offset=2)  # same size, other rows
    with pytest.raises(RunDirError, match=f"data.path={data} changed since the run started.*"
                                          "trainer.resume_changes=allow"):
        check_data_unchanged(tmp_path, files, fresh=False, allow=False)
    [change] = check_data_unchanged(tmp_path, files, fresh=False, allow=True)
    assert change.startswith(f"data.path={data} changed")
    assert check_data_unchanged(tmp_path, files, fresh=False, allow=False) == []  # allowed once: recorded
    other = tmp_path / "e.jsonl"  # another path under the key: a config change, not this check's
    write_rows(other, 20)
    assert check_data_unchanged(tmp_path, {"data.path": str(other)}, fresh=False, allow=False) == []


def test_a_resume_on_a_rewritten_or_shrunk_data_file_is_one_line(tmp_path, capsys):
    data, run_dir = tmp_path / "d.jsonl", tmp_path / "run"
    write_rows(data, 20)
    argv = ["train", str(REPO / "recipes/grpo_arithmetic.yaml"), *TINY, f"data.path={data}",
            f"trainer.run_dir={run_dir}", "trainer.save_every=1"]
    assert main([*argv, "trainer.steps=1"]) == 0
    write_rows(data, 20, offset=2)  # rewritten in place
    capsys.readouterr()
    assert main([*argv, "trainer.steps=2", "trainer.resume=auto"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"data.path={data} changed since the run started" in err, err
    assert "trainer.resume_changes=allow" in err
    write_rows(data, 30)  # more rows: the checkpoint's sampler cannot continue
    assert main([*argv, "trainer.steps=2", "trainer.resume=auto", "trainer.resume_changes=allow"]) == 1
    out, err = capsys.readouterr()
    assert "resuming " + str(run_dir) + " from checkpoint step_1 (step 1 of 2)" in out
    assert f"trainer.resume_changes=allow: data.path={data} changed" in out
    lines = [line for line in err.splitlines() if line.strip() and "it/s]" not in line]  # transformers' loading bars
    assert len(lines) == 1 and "cannot resume at step 1: the data changed since the checkpoint (it drew from 18 " \
                               "training rows, there are 27 now)" in err, err
