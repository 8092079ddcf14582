"""GSM8K: grade-school word problems with a final numeric answer, verified by `math/correct`.

    baton env gsm8k --api URL --server URL --data train.jsonl [--eval-data test.jsonl]
    data: {task: gsm8k, path: train.parquet}        (the embedded path)

Rows come from a local file in GSM8K's format (`question`, `answer` ending `#### N`) or
verl's preprocessed parquet (`prompt` as chat messages, `reward_model.ground_truth`), as
jsonl or parquet (`baton.data.records`). String prompts get verl's instruction appended
("Let's think step by step and output the final answer after \"####\"."); chat prompts are
used as they are (verl's already carry it) and rendered with the tokenizer's chat template.

Scoring: `baton.rewards.math.math_correct` (numeric normalisation, then math-verify) in a
`RewardRunner` with worker processes, so a verification that hangs is SIGKILLed at its
deadline and counted (`verifier_timeouts`), never blocking the environment; math-verify's
own signal-based timeouts stay off (they fail off the main thread).

Without a separate eval file, about 1 row in `heldout_every` (by a hash of the prompt) is
held out for evaluation and never trained on, as in the arithmetic task.
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

from baton.data.records import load_rows
from baton.envs.base import Row
from baton.envs.environment import TaskEnvironment, register_environment
from baton.rewards.math import extract_answer, gsm8k_gold, math_correct, math_equal  # noqa: F401 (registers math/correct)

INSTRUCTION = " Let's think step by step and output the final answer after \"####\"."


def _heldout(row: Row, every: int) -> bool:
    return every > 0 and zlib.crc32(str(row["prompt"]).encode()) % every == 0


@dataclass
class GSM8KTask:
    name: str = "gsm8k"
    path: str = ""  # train rows (jsonl / json / parquet)
    eval_path: str = ""  # held-out rows; "" = hold out 1 in `heldout_every` of `path`
    heldout_every: int = 10
    instruction: str = INSTRUCTION  # appended to string prompts
    reward_weights: dict[str, float] = field(default_factory=lambda: {"math/correct": 1.0})

    def _load(self, path: str) -> list[Row]:
        if not path:
            raise ValueError(f"task {self.name!r} reads its rows from a local file: give its path "
                             f"(data.path / --data: GSM8K jsonl or verl parquet)")
        rows = load_rows(path, require=("answer",), key="data.eval_path" if path == self.eval_path else "data.path")
        for r in rows:
            if isinstance(r["prompt"], str) and self.instruction and self.instruction.strip() not in r["prompt"]:
                r["prompt"] = r["prompt"] + self.instruction
        return rows

    def train_rows(self, n: int | None = None, seed: int = 0) -> list[Row]:
        rows = self._load(self.path)
        if not self.eval_path:
            rows = [r for r in rows if not _heldout(r, self.heldout_every)]
        return rows if n is None else rows[:n]

    def eval_rows(self, n: int = 200) -> list[Row]:
        rows = self._load(self.eval_path) if self.eval_path else [
            r for r in self._load(self.path) if _heldout(r, self.heldout_every)]
        return rows[:n]

    def target(self, row: Row) -> str:
        return str(row["answer"])

    def is_correct(self, completion: str, row: Row) -> bool:
        return math_equal(extract_answer(completion), gsm8k_gold(str(row["answer"])))


class MathScorer:
    """Scores completions with `math/correct` in worker processes with a per-call deadline;
    counts what failed (`timeouts`, `errors`) since it was made."""

    def __init__(self, timeout_s: float = 5.0, workers: int = 2, sandbox: str = "process",
                 function: str = "math/correct"):
        from baton.rewards.runner import RewardRunner

        self.runner = RewardRunner({function: 1.0}, timeout_s=timeout_s, max_workers=workers, sandbox=sandbox)
        self.timeouts = self.errors = 0
        self._lock = threading.Lock()

    def __call__(self, item: Row, completions: list[str]) -> list[float]:
        rows = [{"answer": item["answer"]} for _ in completions]
        with self._lock:  # one RewardRunner call at a time (it is not re-entrant)
            totals, _, stats = self.runner.score([str(item["prompt"])] * len(completions), completions, rows)
            self.timeouts += sum(stats.timeouts)
            self.errors += sum(stats.errors) + sum(stats.nonfinite)
        return totals

    def close(self) -> None:
        self.runner.close()


@register_environment("gsm8k")
def gsm8k_environment(tokenizer: Any, *, data: str = "", eval_data: str = "", timeout_s: float = 5.0,
                      verifier_workers: int = 2, **options: Any) -> TaskEnvironment:
    """GSM8K from local files, scored by math verification in killable worker processes."""
    task = GSM8KTask(path=data, eval_path=eval_data)
    options.setdefault("max_new_tokens", 256)
    scorer = MathScorer(timeout_s=timeout_s, workers=verifier_workers)
    env = TaskEnvironment(task, tokenizer, rows=task.train_rows(), eval_rows=task.eval_rows(), score_fn=scorer,
                          **options)
    env.scorer = scorer  # the runner reports scorer.timeouts / errors and closes it
    return env
