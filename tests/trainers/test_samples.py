"""samples.jsonl: a few completions of step 1 and of each evaluation step, and the last ones
in the final summary."""

import io
import json

import torch
from rich.console import Console

from baton import fields as F
from baton.batch import Batch
from baton.trainers.report.samples import SampleLog, last_samples, pick_rows, print_last_samples


def test_pick_rows_takes_the_first_rows_of_the_first_groups():
    #         rows: 0  1  2  3  4  5  6  7  8
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 3])
    assert pick_rows(groups, groups=2, per_group=2) == [0, 1, 3, 4]
    assert pick_rows(torch.tensor([5, 9, 5, 9, 7]), groups=2, per_group=1) == [0, 1]


def batch(rewards):
    b = Batch({F.REWARDS: torch.tensor(rewards)})
    b[F.PROMPT_TEXT] = [f"{i}+1=" for i in range(len(rewards))]
    b[F.COMPLETION_TEXT] = ["7"] * len(rewards)
    b["answer"] = [str(i + 1) for i in range(len(rewards))]
    return b


def test_written_at_step_one_and_each_evaluation_then_shown(tmp_path):
    log, groups = SampleLog(tmp_path, eval_every=2, steps=3), torch.arange(4) // 2
    for step in (1, 2, 3):
        log.write(step, batch([0.0, 1.0, 0.0, 0.0]), groups)
    lines = [json.loads(ln) for ln in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1] * 4 + [2] * 4 + [3] * 4  # 3 = the last step
    assert lines[1] == {"step": 1, "prompt": "1+1=", "completion": "7", "reward": 1.0, "answer": "2"}
    assert [r["step"] for r in last_samples(tmp_path)] == [3] * 4
    out = io.StringIO()
    print_last_samples(tmp_path, Console(file=out, width=200))
    assert "sampled completions at step 3" in out.getvalue() and "reward 1.000  '1+1=' -> '7'" in out.getvalue()
    SampleLog(tmp_path, eval_every=2, steps=3).write(3, batch([0.0] * 4), groups)  # a resume re-runs step 3
    assert [json.loads(ln)["step"] for ln in (tmp_path / "samples.jsonl").read_text().splitlines()] == [1] * 4 + [2] * 4 + [3] * 4
    SampleLog(tmp_path, eval_every=2, steps=3).write(1, batch([0.0] * 4), groups)  # a fresh run starts it over
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 4
