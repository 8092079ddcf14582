"""The run's ledger: which prompts each trained step used, saved inside every checkpoint, so
"every prompt trained exactly once" is checkable from the run dir (`baton ledger RUN_DIR
[OTHER_RUN_DIR]`).

    entry = step_entry(step, batch, seed)     # after the step's rows are drawn (driver)
    state.ledger.append(entry)                # RunState: saved with the sampler's position
    ledger = read_ledger(run_dir)             # the newest complete checkpoint's

An entry per trained step: {"step", "seed", "ids": one id per group, in the batch's order}.
An id is the trajectory API's `group_id` (rows from `baton api`: the source puts them in the
batch's meta under `fields.LEDGER_IDS`), else "p:" + the first 16 hex digits of the sha256 of the
group's prompt text (a dataset row, by content: two equal rows have one id, counted twice).
`seed`: the run's sampling seed and the step its seeds derive from ("SEED:STEP"; the rows of
step s are sampled with seeds of (seed, s, rank)), None where the rows were sampled
elsewhere (the API's environments). A resumed run's ledger continues the checkpoint's, so
after any crash the newest checkpoint's ledger lists what the weights in it were trained on.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from baton import fields as F
from baton.runs.checkpoints import TRAINER_STATE, latest_complete_checkpoint
from baton.runs.rundir import RunDirError


def prompt_id(prompt: Any) -> str:
    """A dataset row's id by content: its prompt (text, or chat messages) hashed."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return "p:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def group_ids(batch: Any) -> list[Any]:
    """One id per group of `batch`, in the order its groups first appear."""
    if F.LEDGER_IDS in batch.meta:
        return list(batch.meta[F.LEDGER_IDS])
    groups = batch[F.GROUP_INDEX].tolist()
    prompts = batch[F.PROMPT_TEXT]
    first = {g: i for i, g in reversed(list(enumerate(groups)))}
    return [prompt_id(prompts[first[g]]) for g in dict.fromkeys(groups)]


def step_entry(step: int, batch: Any, seed: int | None) -> dict[str, Any]:
    """The ledger entry of trainer step `step` trained on `batch` (sampled with `seed`, or None)."""
    sampled_here = F.LEDGER_IDS not in batch.meta
    return {"step": step, "seed": f"{seed}:{step}" if sampled_here and seed is not None else None,
            "ids": group_ids(batch)}


def read_ledger(run_dir: str | Path) -> list[dict[str, Any]]:
    """The ledger of the newest complete checkpoint of `run_dir` (a RunDirError, one line, if
    it has none, or its checkpoint predates ledgers)."""
    import torch  # here: `baton ledger --help` stays quick

    ckpt, _ = latest_complete_checkpoint(Path(run_dir))
    if ckpt is None:
        raise RunDirError(f"{run_dir}: no complete checkpoint (checkpoints/step_N) to read a ledger from")
    state = torch.load(ckpt / TRAINER_STATE, weights_only=False, map_location="cpu")
    driver = state.get("driver", state) if isinstance(state, dict) else {}
    if "ledger" not in driver:
        raise RunDirError(f"{ckpt}: the checkpoint has no ledger (written before ledgers were kept)")
    return list(driver["ledger"])


def summary(ledger: list[dict[str, Any]]) -> str:
    """One line: steps, groups trained, distinct ids, ids trained more than once."""
    counts = Counter(i for e in ledger for i in e["ids"])
    twice = sorted((str(i) for i, c in counts.items() if c > 1))
    return (f"{len(ledger)} steps, {sum(counts.values())} groups trained, {len(counts)} distinct ids, "
            f"{len(twice)} trained more than once" + (f" ({', '.join(twice[:5])})" if twice else ""))


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Where ledger `b` departs from `a`, step by step (empty: equal)."""
    out = []
    steps_a, steps_b = {e["step"]: e for e in a}, {e["step"]: e for e in b}
    for step in sorted(set(steps_a) | set(steps_b)):
        ea, eb = steps_a.get(step), steps_b.get(step)
        if ea is None or eb is None:
            out.append(f"step {step}: only in the {'first' if eb is None else 'second'} run")
        elif ea != eb:
            lost = Counter(map(str, ea["ids"])) - Counter(map(str, eb["ids"]))
            extra = Counter(map(str, eb["ids"])) - Counter(map(str, ea["ids"]))
            what = [f"seed {ea['seed']} vs {eb['seed']}"] if ea["seed"] != eb["seed"] else []
            what += [f"not in the second: {', '.join(sorted(lost))}"] if lost else []
            what += [f"only in the second: {', '.join(sorted(extra))}"] if extra else []
            out.append(f"step {step}: " + ("; ".join(what) or "same ids in another order"))
    return out


def ledger_main(run_dir: str, other: str | None = None) -> int:
    """`baton ledger RUN_DIR [OTHER_RUN_DIR]`: print the ledger (one line per step), or compare
    two runs' (exit 0 equal, 1 not)."""
    mine = read_ledger(run_dir)
    if other is None:
        for e in mine:
            print(f"step {e['step']}  seed {e['seed']}  " + " ".join(map(str, e["ids"])))
        print(summary(mine))
        return 0
    theirs = read_ledger(other)
    diffs = compare(mine, theirs)
    print(f"{run_dir}: {summary(mine)}\n{other}: {summary(theirs)}")
    for line in diffs:
        print(line)
    print("ledgers equal" if not diffs else f"ledgers differ at {len(diffs)} step(s)")
    return 0 if not diffs else 1
