"""A run's timeline: which role ran which call when, on which rank (`timeline.jsonl`).

The hosts record the wall-clock start and end of every driver call (see
`WorkerGroup.call_log`); after each step the driver takes the step's records from every
role and appends them here, one JSON line per call and rank:

    {"step": 3, "role": "critic", "method": "update_critic", "rank": 0, "pid": 812,
     "start": 1763800000.12, "end": 1763800001.98}

`overlap` measures how much two calls ran at the same time: the fraction of the *shorter*
one that lies inside the other, each call's span taken over all its ranks (first start to
last end). 1 = the shorter ran entirely during the longer; 0 = one after the other (always
0 for roles in one process: a process runs one call at a time). The PPO driver logs the
overlap of `actor.update` and `critic.update_critic` per step as `timeline/update_overlap`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

TIMELINE_FILE = "timeline.jsonl"


def take(roles: dict[str, Any]) -> list[dict[str, Any]]:
    """Every role's calls since the last take, oldest first."""
    records = [rec for group in roles.values() for rec in group.call_log()]
    return sorted(records, key=lambda r: (r["start"], r["role"], r["rank"]))


def append(path: Path, step: int, records: Iterable[dict[str, Any]]) -> None:
    with open(path, "a") as f:
        for rec in records:
            f.write(json.dumps({"step": step, **rec}) + "\n")


def truncate_after(path: Path, step: int) -> None:
    """Drop the lines of steps after `step` (a resumed run redoes them)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (ValueError, KeyError):  # a torn last line
            continue
    path.write_text("".join(line + "\n" for line in keep))


def read(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def span(records: Iterable[dict[str, Any]], role: str, method: str) -> tuple[float, float] | None:
    """(first start, last end) of `role.method` over all its ranks; None if it did not run."""
    mine = [r for r in records if r["role"] == role and r["method"] == method]
    if not mine:
        return None
    return min(r["start"] for r in mine), max(r["end"] for r in mine)


def overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> float | None:
    """Fraction of the shorter span that lies inside the other (None if either is missing)."""
    if a is None or b is None:
        return None
    shorter = min(a[1] - a[0], b[1] - b[0])
    both = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    return both / shorter if shorter > 0 else 0.0


def step_overlaps(records: list[dict[str, Any]]) -> dict[str, float]:
    """The overlaps a PPO step reports: the two updates, and the critic's values against the
    reference's logprobs and the rewards (the scoring futures)."""
    out: dict[str, float] = {}
    pairs = {"update_overlap": (("actor", "update"), ("critic", "update_critic")),
             "values_ref_overlap": (("critic", "compute_values"), ("reference", "compute_ref_logprobs")),
             "values_reward_overlap": (("critic", "compute_values"), ("reward", "compute_rewards"))}
    for name, (a, b) in pairs.items():
        value = overlap(span(records, *a), span(records, *b))
        if value is not None:
            out[f"timeline/{name}"] = value
    return out


class Timeline:
    """The run's timeline file, fed by the run session: `start(step)` after set-up (a fresh
    run starts the file anew, a resumed one drops the steps it redoes), `forget()` drops
    records that are no step's (set-up, evaluation, saving), `record(step)` appends the
    step's records and returns its overlaps (`timeline/*` metrics)."""

    def __init__(self, roles: dict[str, Any], path: Path) -> None:
        self.roles, self.path = roles, Path(path)

    def start(self, step: int) -> None:
        if step:
            truncate_after(self.path, step)
        elif self.path.exists():
            self.path.unlink()
        self.forget()

    def forget(self) -> None:
        take(self.roles)

    def record(self, step: int) -> dict[str, float]:
        records = take(self.roles)
        append(self.path, step, records)
        return step_overlaps(records)
