"""reasoning-gym's procedural datasets as a baton task (`data.task: reasoning_gym`; the extra
`pip install -e '.[reasoning-gym]'`, imported only by a run that chooses the task).

    data:
      task: reasoning_gym
      task_args:
        datasets:                        # name -> weight, or {weight: w, <the dataset's config>}
          basic_arithmetic: {weight: 1.0, operators: ["+"], max_digits: 1, allow_parentheses: false}
          chain_sum: 0.5
        size: 10000                      # training rows (default 10000)

Rows come from the datasets' generators (`reasoning_gym.create_dataset(name, seed=..., **config)`),
each row's dataset drawn by weight, all under the run's seed (`data.seed`): the same seed gives
the same rows in every process. A question whose crc32 falls in 1 of `heldout_every` is held
out: training rows never include one, evaluation rows are only those (drawn under a fixed
seed), so held-out accuracy is on questions never trained on, whatever the seeds and sizes.

A row is `{"prompt": question, "answer", "dataset", "metadata": json}`; its reward
(`reasoning_gym/score`) is the dataset's own `score_answer(answer, entry)` on the completion's
`<answer>...</answer>` (or the whole completion, stripped, when it has no such tag: what a
tiny model trained on bare answers writes), and the verifier (`is_correct`) is that score = 1.
Scoring needs only the row, so a reward worker or a Ray worker scores without the task's
configuration.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from baton.envs.base import Row
from baton.rewards.registry import register_reward
from baton.user_modules import require_extra

NAME = "reasoning_gym"


def _rg() -> Any:
    return require_extra("reasoning_gym", "reasoning-gym", f"data.task={NAME}")


def heldout(question: str, every: int) -> bool:
    """Whether `question` is held out (crc32: the same in every process, unlike hash())."""
    return zlib.crc32(question.encode()) % every == 0


def extract(completion: str) -> str:
    """The answer in a completion: its last `<answer>...</answer>`, else the whole text
    (a literal <eos> and outer whitespace dropped)."""
    if "<answer>" in completion:
        found = _rg().utils.extract_answer(completion, tag_name="answer")
        if found is not None:
            return found
    return completion.split("<eos>", 1)[0].strip()


@lru_cache(maxsize=None)
def _scorer(dataset: str) -> Any:
    return _rg().get_score_answer_fn(dataset)


def score(completion: str, row: Row) -> float:
    """The row's dataset's `score_answer` on the completion's answer (module docstring)."""
    entry = {"question": row.get("prompt"), "answer": row["answer"], "metadata": json.loads(row["metadata"])}
    return float(_scorer(row["dataset"])(extract(completion), entry))


@register_reward("reasoning_gym/score")
def reasoning_gym_score(prompt: str, completion: str, **row: Any) -> float:
    """reasoning-gym's `score_answer` for the row's dataset (0..1; 1 = right)."""
    return score(completion, {"prompt": prompt, **row})


def parse_datasets(datasets: dict[str, Any]) -> dict[str, tuple[float, dict[str, Any]]]:
    """`{name: weight | {weight, **config}}` -> `{name: (weight, config)}`, checked against
    reasoning-gym's registry (ValueError naming the bad entry)."""
    if not isinstance(datasets, dict) or not datasets:
        raise ValueError(f"data.task={NAME} needs data.task_args.datasets: {{name: weight, ...}} "
                         f"(e.g. {{basic_arithmetic: 1.0}})")
    known = _rg().factory.DATASETS
    out = {}
    for name, spec in datasets.items():
        if name not in known:
            raise ValueError(f"data.task_args.datasets: {name!r} is not a reasoning-gym dataset; known: "
                             f"{sorted(known)[:12]} ... ({len(known)} in all)")
        config = dict(spec) if isinstance(spec, dict) else {"weight": spec}
        weight = config.pop("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"data.task_args.datasets.{name}: weight must be a number > 0, got {weight!r}")
        bad = {"seed", "size"} & set(config)
        if bad:
            raise ValueError(f"data.task_args.datasets.{name}: {sorted(bad)} are set by baton (data.seed, "
                             f"data.task_args.size)")
        try:
            _rg().create_dataset(name, seed=0, size=1, **config)
        except (TypeError, AssertionError, ValueError) as e:
            raise ValueError(f"data.task_args.datasets.{name}: {e or type(e).__name__}") from None
        out[name] = (float(weight), config)
    return out


@dataclass(frozen=True)
class ReasoningGymTask:
    """reasoning-gym datasets as a Task (module docstring); `configure(**data.task_args)` gives
    the configured task (the registered instance has no datasets and only scores rows)."""
    name: str = NAME
    datasets: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    size: int = 10_000
    heldout_every: int = 10
    eval_seed: int = 12_345
    reward_weights: dict[str, float] = field(default_factory=lambda: {"reasoning_gym/score": 1.0})

    def configure(self, datasets: Any = None, size: int = 10_000, heldout_every: int = 10) -> "ReasoningGymTask":
        for key, value in (("size", size), ("heldout_every", heldout_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "size" else 2):
                raise ValueError(f"data.task_args.{key} must be an int >= {1 if key == 'size' else 2}, got {value!r}")
        return replace(self, datasets=parse_datasets(datasets), size=size, heldout_every=heldout_every)

    def _rows(self, n: int, seed: int, held: bool) -> list[Row]:
        if not self.datasets:
            raise ValueError(f"data.task={NAME} needs data.task_args.datasets (the registered task only scores)")
        rg, rng = _rg(), random.Random(seed)
        names = list(self.datasets)
        weights = [self.datasets[k][0] for k in names]
        # one generator per dataset, seeded from (seed, name); rows are read in index order
        gens = {k: rg.create_dataset(k, seed=random.Random(f"{seed}/{k}").randrange(2**31), size=2**31 - 1,
                                     **self.datasets[k][1]) for k in names}
        index = dict.fromkeys(names, 0)
        rows: list[Row] = []
        limit = 1000 * n + 10_000
        while len(rows) < n:
            k = rng.choices(names, weights)[0]
            entry, index[k] = gens[k][index[k]], index[k] + 1
            if sum(index.values()) > limit:
                raise RuntimeError(f"{NAME}: too few {'held-out' if held else 'training'} questions in {names}")
            if heldout(entry["question"], self.heldout_every) == held:
                rows.append({"prompt": entry["question"], "answer": str(entry["answer"]), "dataset": k,
                             "metadata": json.dumps(entry.get("metadata", {}), default=str)})
        return rows

    def train_rows(self, n: int | None = None, seed: int = 0) -> list[Row]:
        return self._rows(self.size if n is None else n, seed, held=False)

    def eval_rows(self, n: int = 200) -> list[Row]:
        return self._rows(n, self.eval_seed, held=True)

    def target(self, row: Row) -> str:
        return str(row["answer"])

    def is_correct(self, completion: str, row: Row) -> bool:
        return score(completion, row) >= 1.0
