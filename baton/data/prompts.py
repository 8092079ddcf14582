"""Prompt datasets and a seeded, resumable sampler over them.

Rows are plain dicts (`{"prompt": ..., "answer": ...}`) from a jsonl file, a task's
generator, or a Hugging Face `datasets` directory saved with `save_to_disk`.

`PromptSampler` walks a fresh seeded permutation of the rows each epoch. Its state is just
(epoch, position): the permutation of epoch e is a pure function of (seed, e), so a run
resumed from `state_dict()` draws exactly the batches an uninterrupted run would have.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def load_jsonl(path: str | os.PathLike, prompt_key: str = "prompt") -> list[Row]:
    """Rows of a jsonl file (one object per line, blank lines skipped); each needs `prompt_key`."""
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if prompt_key not in row:
                raise ValueError(f"{path}:{lineno}: row has no {prompt_key!r} field: {sorted(row)}")
            rows.append(_rename(row, prompt_key))
    return rows


def load_hf_disk(path: str | os.PathLike, split: str = "train", prompt_key: str = "prompt") -> list[Row]:
    """Rows of a `datasets` dataset saved with `save_to_disk` (needs the optional `datasets`)."""
    try:
        import datasets  # optional dependency: only this loader needs it
    except ImportError as e:
        raise ImportError("loading a HF dataset dir needs `pip install datasets`") from e
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[split]
    return [_rename(dict(r), prompt_key) for r in ds]


def _rename(row: Row, prompt_key: str) -> Row:
    if prompt_key != "prompt":
        row = dict(row)
        row["prompt"] = row.pop(prompt_key)
    return row


def load_prompts(source: str, n: int | None = None, seed: int = 0, prompt_key: str = "prompt") -> list[Row]:
    """Rows from `source`: a `.jsonl` file or a `save_to_disk` dir (a task's own rows come
    from `baton.envs.get_task(name).train_rows`)."""
    p = Path(source)
    if p.is_file():
        rows = load_jsonl(p, prompt_key)
    elif p.is_dir():
        rows = load_hf_disk(p, prompt_key=prompt_key)
    else:
        raise FileNotFoundError(f"prompt source {source!r} is neither a .jsonl file nor a save_to_disk dir")
    return rows if n is None else rows[:n]


class PromptSampler:
    """Endless seeded batches of rows; epoch-wise reshuffled; resumable."""

    def __init__(self, rows: list[Row], seed: int = 0, shuffle: bool = True):
        if not rows:
            raise ValueError("PromptSampler needs at least one row")
        self.rows = rows
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0  # rows of the current epoch already handed out
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.rows)))
        import torch  # here, not at the top: reward worker processes import the tasks' modules (2 s of torch)

        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.rows), generator=g).tolist()

    def next_batch(self, n: int) -> list[Row]:
        """The next n rows; a batch that runs past the end of an epoch continues into the next."""
        out = []
        while len(out) < n:
            if self.position == len(self.rows):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            take = min(n - len(out), len(self.rows) - self.position)
            out += [self.rows[i] for i in self._order[self.position:self.position + take]]
            self.position += take
        return out

    def __len__(self) -> int:
        return len(self.rows)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "size": len(self.rows)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("size", len(self.rows)) != len(self.rows) or state.get("seed", self.seed) != self.seed:
            raise ValueError(f"sampler state is for seed={state.get('seed')} size={state.get('size')}, "
                             f"this sampler has seed={self.seed} size={len(self.rows)}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)
