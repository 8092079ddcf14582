"""Reading `metrics.jsonl` after a crash, and cutting it back to a checkpoint on resume.

The file is append-only, one JSON object per line, each with a `step`. A process killed
mid-append leaves a torn last line (after a power loss: possibly a run of NUL bytes); that
line is skipped with a warning, since everything before it is intact. A line that does not
parse anywhere else means the file was damaged otherwise (or something appended after a
torn line): that is an error naming the line, not something to paper over.

`truncate_after(path, step)` is for resume: it keeps only the lines with `step <= N` (the
step of the checkpoint resumed from), byte for byte, and drops a torn last line, by writing
a temp file, fsyncing it and renaming it over the original; a crash leaves the old file or
the new one.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from baton.runs.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)

__all__ = ["METRICS_FILE", "MetricsLogError", "read_metrics", "truncate_after"]

METRICS_FILE = "metrics.jsonl"


class MetricsLogError(ValueError):
    """metrics.jsonl is damaged somewhere other than its last line."""


RECOVER = ("Restore the file, or delete the damaged line (that step's metrics are lost), or start over "
           "with trainer.overwrite=true")


def _resolve(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / METRICS_FILE if p.is_dir() else p


def _parse(path: Path) -> list[tuple[bytes, dict[str, Any]]]:
    """(raw line, record) for every line, blank lines skipped; a torn last line is dropped
    with a warning, a bad line elsewhere raises MetricsLogError."""
    lines = path.read_bytes().split(b"\n")  # a final "" when the file ends with a newline
    out: list[tuple[bytes, dict[str, Any]]] = []
    last = max((i for i, ln in enumerate(lines) if ln.strip(b" \t\r")), default=-1)
    for i, raw in enumerate(lines):
        if not raw.strip(b" \t\r"):
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict):
                raise ValueError(f"a JSON {type(rec).__name__}, not an object")
        except ValueError as e:
            if i == last:
                log.warning("%s: skipping torn last line %d (%d bytes; the writer was killed "
                            "mid-line?): %.80r", path, i + 1, len(raw), raw)
                break
            raise MetricsLogError(f"{path}: line {i + 1} of {last + 1} is not a JSON object ({e}): "
                                  f"{raw[:80]!r}; only a torn last line is skipped. {RECOVER}") from None
        out.append((raw, rec))
    return out


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (or of RUN_DIR/metrics.jsonl); [] if it does not exist.
    A torn last line is skipped with a warning; a bad line elsewhere raises MetricsLogError."""
    p = _resolve(path)
    if not p.exists():
        return []
    return [rec for _, rec in _parse(p)]


def truncate_after(path: str | os.PathLike, step: int) -> tuple[int, int]:
    """Keep only the lines with `step <= step` (and drop a torn last line), atomically.
    Returns (kept, dropped) line counts; (0, 0) if the file does not exist. Every line must
    carry an integer `step` (MetricsLogError otherwise: a line that cannot be placed is not
    silently dropped or kept)."""
    p = _resolve(path)
    if not p.exists():
        return 0, 0
    entries = _parse(p)
    keep: list[bytes] = []
    for n, (raw, rec) in enumerate(entries, 1):
        s = rec.get("step")
        if not isinstance(s, int) or isinstance(s, bool):
            raise MetricsLogError(f"{p}: record {n} has no integer 'step': {raw[:80]!r}")
        if s <= step:
            keep.append(raw.rstrip(b"\r"))
    data = b"".join(ln + b"\n" for ln in keep)
    dropped = len(entries) - len(keep)
    if data == p.read_bytes():
        return len(keep), 0
    atomic_write_bytes(p, data)
    if dropped:
        log.info("%s: dropped %d line(s) after step %d (resuming from it)", p, dropped, step)
    return len(keep), dropped
