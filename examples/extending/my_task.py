"""A custom task with its own verifier (docs/EXTENDING.md, part 2).

Sums modulo 10: prompt "3+5+8%10=", answer "6". The verifier compares numbers, not strings
("06" and " 6" are right too). Name it in a recipe as `data.task: my_task:ModSumTask`;
every process of the run (driver, Ray workers, `baton env`, `baton eval`) imports it the same
way. `correct` is its reward function: `reward.functions: {"my_task:correct": 1.0}`.
"""

import random
import zlib


def correct(prompt: str, completion: str, answer: str = "", **row) -> float:
    """1.0 if the completion is the answer's number."""
    try:
        return 1.0 if int(completion.strip()) == int(answer) else 0.0
    except ValueError:
        return 0.0


class ModSumTask:
    name = "modsum"
    reward_weights = {"my_task:correct": 1.0}

    def _rows(self, n: int, seed: int, heldout: bool) -> list[dict]:
        rng, rows = random.Random(seed), []
        while len(rows) < n:
            terms = [rng.randint(0, 9) for _ in range(rng.randint(2, 4))]
            prompt = "+".join(map(str, terms)) + "%10="
            if (zlib.crc32(prompt.encode()) % 10 == 0) == heldout:  # held-out prompts: never trained on
                rows.append({"prompt": prompt, "answer": str(sum(terms) % 10)})
        return rows

    def train_rows(self, n: int | None = None, seed: int = 0) -> list[dict]:
        return self._rows(2000 if n is None else n, seed, heldout=False)

    def eval_rows(self, n: int = 200) -> list[dict]:
        return self._rows(n, 12345, heldout=True)

    def target(self, row: dict) -> str:
        return row["answer"]

    def is_correct(self, completion: str, row: dict) -> bool:
        return correct(row["prompt"], completion, answer=row["answer"]) == 1.0
