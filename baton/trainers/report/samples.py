"""A few of a run's sampled completions, where a user can read them: `samples.jsonl` in the run
dir (one line per completion: step, prompt, completion, reward, and the row's answer if it has
one), written at the first step and at every evaluation, and the last ones printed in the final
summary (`print_last_samples`). They are rows the step trained on, scored by the run's own
rewards, so a run whose reward never moves shows why (TRL logs completions; verl prints
validation generations).

    log = SampleLog(run_dir, eval_every, steps)
    log.write(step, batch, group_index)   # a no-op unless step 1 or an evaluation step
    log.write_records(step, records)      # SFT / RM: their evaluation's own lines (step 0 too)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from baton import fields as F
from baton.batch import Batch
from baton.runs.metrics_log import truncate_after

SAMPLES_FILE = "samples.jsonl"
GROUPS, PER_GROUP = 4, 2  # completions written per evaluation: PER_GROUP of each of the first GROUPS prompts


def pick_rows(group_index: torch.Tensor, groups: int = GROUPS, per_group: int = PER_GROUP) -> list[int]:
    """Row indices: the first `per_group` rows of each of the first `groups` groups, in order."""
    taken: dict[int, int] = {}
    out = []
    for i, g in enumerate(group_index.tolist()):
        if g not in taken and len(taken) == groups:
            continue
        if taken.get(g, 0) < per_group:
            taken[g] = taken.get(g, 0) + 1
            out.append(i)
    return out


def sample_records(step: int, batch: Batch, group_index: torch.Tensor) -> list[dict[str, Any]]:
    """The lines of `samples.jsonl` for `step` from its scored rows."""
    if F.COMPLETION_TEXT not in batch or F.REWARDS not in batch:
        return []
    answers = batch.non_tensors.get("answer")
    out = []
    for i in pick_rows(group_index):
        prompt = batch[F.PROMPT_TEXT][i] if F.PROMPT_TEXT in batch else ""
        record = {"step": step, "prompt": prompt, "completion": str(batch[F.COMPLETION_TEXT][i]),
                  "reward": round(float(batch[F.REWARDS][i]), 6)}
        if answers is not None and answers[i] is not None:
            record["answer"] = str(answers[i])
        out.append(record)
    return out


class SampleLog:
    """Appends a few completions to `run_dir/samples.jsonl` at step 1 and at each evaluation
    step (every `eval_every`, and the last)."""

    def __init__(self, run_dir: str | Path, eval_every: int, steps: int) -> None:
        self.path = Path(run_dir) / SAMPLES_FILE
        self.eval_every, self.steps = eval_every, steps
        self.fresh = True  # the first write drops lines of this step on: a new run's, or a resume's re-run steps

    def due(self, step: int) -> bool:
        return step in (1, self.steps) or bool(self.eval_every and step % self.eval_every == 0)

    def write(self, step: int, batch: Batch, group_index: torch.Tensor) -> None:
        if self.due(step):
            self.write_records(step, sample_records(step, batch, group_index))

    def write_records(self, step: int, records: list[dict[str, Any]]) -> None:
        """Append `records` (lines of this file's shape) as step `step`'s: what a driver
        without scored rollouts writes at each evaluation (SFT's held-out completions, a
        reward model's held-out pairs)."""
        if self.fresh:
            truncate_after(self.path, step - 1)
            self.fresh = False
        with open(self.path, "a") as f:
            f.writelines(json.dumps(r, default=str) + "\n" for r in records)


def last_samples(run_dir: str | Path) -> list[dict[str, Any]]:
    """The lines of the last step written to `run_dir/samples.jsonl` ([] if none)."""
    path = Path(run_dir) / SAMPLES_FILE
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a torn last line (a crash while writing)
    last = records[-1]["step"] if records else None
    return [r for r in records if r["step"] == last]


def print_last_samples(run_dir: str | Path, console: Any, width: int = 60) -> None:
    """The final summary's sampled completions: the last step's lines of samples.jsonl."""
    records = last_samples(run_dir)
    if not records:
        return
    console.print(f"sampled completions at step {records[0]['step']} ({SAMPLES_FILE} has every evaluation's):",
                  markup=False)
    for r in records:
        prompt = r["prompt"] if isinstance(r["prompt"], str) else json.dumps(r["prompt"])
        console.print(f"  reward {r['reward']:.3f}  {prompt[-width:]!r} -> {r['completion'][:width]!r}", markup=False)
