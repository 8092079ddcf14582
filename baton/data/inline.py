"""Rows given as Python objects (`baton.train(train_dataset=...)`) as a data file a recipe names.

    path = rows_file([{"prompt": "2+3=", "answer": "5"}, ...], "train_dataset")   # -> data.path

What it takes: a path (returned as it is: the file loaders read it), a list (or tuple) of
dicts, a `datasets.Dataset` or anything with `.to_list()` (duck-typed: `datasets` is never
imported here), a pandas DataFrame (`.to_dict("records")`), or any iterable of dicts. Every
row is checked as a data file's row is (`normalize_row`: one DataError naming "train_dataset
row N" and the field) before anything is written; the rows are then written, as they are, to
a jsonl file named by a hash of its contents under the rows cache (`BATON_ROWS_CACHE`, else
`$XDG_CACHE_HOME/baton/rows`, else `~/.cache/baton/rows`). The same rows are the same file,
so a run resumed with the same rows passes the data-unchanged check, and the run's
config.yaml names a file `baton train` and `baton eval --recipe` can read.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from baton.data.records import DataError, normalize_row
from baton.runs.fsutil import atomic_write_text

CACHE_ENV = "BATON_ROWS_CACHE"


def rows_cache() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "baton" / "rows"


def as_rows(data: Any, what: str) -> list[Any]:
    """The rows of a list, a `datasets.Dataset` (or anything with `.to_list()`), a DataFrame,
    or an iterable; DataError for anything else."""
    if isinstance(data, (list, tuple)):
        return list(data)
    if hasattr(data, "to_list") and callable(data.to_list):
        return list(data.to_list())
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
        return list(data.to_dict("records"))
    if isinstance(data, dict) or isinstance(data, (str, bytes)) or not hasattr(data, "__iter__"):
        raise DataError(f"{what}: a path, a list of dicts, or a datasets.Dataset, got a {type(data).__name__}")
    return list(data)


def rows_file(data: Any, what: str = "train_dataset") -> str:
    """A path for `data` (see the module docstring): a path as it is, rows as a cached jsonl."""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    rows = as_rows(data, what)
    if not rows:
        raise DataError(f"{what}: holds no rows")
    lines = []
    for i, row in enumerate(rows):
        where = f"{what} row {i + 1}"
        normalize_row(row, where)
        try:
            lines.append(json.dumps(row, ensure_ascii=False, sort_keys=True))
        except (TypeError, ValueError) as e:
            raise DataError(f"{where}: not JSON-serialisable ({e}); rows hold strings, numbers, lists and "
                            f"dicts") from None
    text = "\n".join(lines) + "\n"
    path = rows_cache() / f"{what}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not path.is_file():
        atomic_write_text(path, text)
    return str(path)
