#!/usr/bin/env python3
"""Mutation score of the learning path: a fixed, reviewed list of semantic mutants (sign
flips, dropped terms, swapped clip bounds, a removed detach, mean for sum, off-by-one masks,
a weight applied twice, staleness ignored), each applied alone to a scratch copy of the
working tree, each run against the default-run tests that should kill it.

    .venv/bin/python scripts/mutants.py                 # every mutant; the table and the score
    .venv/bin/python scripts/mutants.py --smoke         # SMOKE: a few, one per area (CI's default run)
    .venv/bin/python scripts/mutants.py --only ppo-gae-negated ppo-offpolicy-dropped
    .venv/bin/python scripts/mutants.py --list          # the list, nothing run
    .venv/bin/python scripts/mutants.py --check         # every original snippet is in its file once

How: the tracked and untracked-not-ignored files are copied to a temp dir once (never the
working tree: it is only read); each mutant replaces its `original` snippet (which must
occur exactly once in its file) by `replacement`, runs
`python -m pytest -x -q -n 0 -p no:cacheprovider TESTS` there (PYTHONPATH = the copy, so
`import baton` is the mutated code; PYTHONDONTWRITEBYTECODE: no stale bytecode between
mutants), and restores the file. A mutant is killed when pytest fails (exit != 0, a timeout
included); first the unmutated copy must pass every selection, or the script stops.

Adding a mutant (e.g. for a new algorithm): append a `Mutant(...)` to MUTANTS with the tests
that should kill it (a selection below, or a test file / node id); `--check` (run by
tests/test_mutants.py in the default run) keeps every snippet present as the code moves.
Exit status: 0 when every mutant is killed, 1 when any survives (or the baseline fails).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# --- test selections (default-run tests; each a few seconds to ~30 s on a loaded 2-core box) ---
D = "tests/direction/test_ppo_family.py::"
DIRECTION_GRPO = (D + "test_group_estimators",)
DIRECTION_GAE = (D + "test_ppo_gae_advantages_are_returns_minus_values_and_the_critic_fits_them",)
DIRECTION_OFF_POLICY = (D + "test_off_policy_weights_scale_the_update_exactly_where_they_are_not_one",)
DIRECTION_KL_REWARD = (D + "test_kl_in_the_reward_is_subtracted_per_token",)
DIRECTION_KL_LOSS = (D + "test_kl_in_the_loss_pulls_toward_the_reference",)
DIRECTION_GSPO = (D + "test_gspo_pushes_rewarded_rows_up",)
DIRECTION_DAPO = (D + "test_dapo_keeps_groups_with_a_signal_and_pushes_them",)
DIRECTION_RPP = (D + "test_reinforce_pp_whitens_over_the_batch",)
DIRECTION_REMAX = (D + "test_remax_subtracts_the_greedy_reward",)
DIRECTION_DPO = ("tests/direction/test_preference.py",)
DIRECTION_SFT = ("tests/direction/test_supervised.py",)
DIRECTION_MASK = ("tests/direction/test_observation_mask.py",)


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to the repository root
    original: str  # occurs exactly once in the file
    replacement: str
    description: str
    tests: tuple[str, ...]  # pytest paths / node ids that should kill it


def M(id: str, file: str, original: str, replacement: str, description: str, *tests: str) -> Mutant:
    return Mutant(id, file, original, replacement, description, tuple(tests))


PPO = "baton/trainers/ppo.py"

MUTANTS: list[Mutant] = [
    # --- the PPO-family driver ---------------------------------------------------------
    M("ppo-gae-negated", PPO,
      "            if proximal:  # mu (the engine",
      "            batch[F.ADVANTAGES] = -batch[F.ADVANTAGES]\n            if proximal:  # mu (the engine",
      "the issue's mutant: the estimator's advantages negated in the driver", *DIRECTION_GAE, *DIRECTION_GRPO),
    M("ppo-offpolicy-dropped", PPO,
      "                    batch[F.ADVANTAGES] = batch[F.ADVANTAGES] * weights",
      "                    pass",
      "the issue's mutant: the TIS / decoupled weights never reach the update", *DIRECTION_OFF_POLICY),
]

SMOKE = ("ppo-gae-negated", "ppo-offpolicy-dropped")


def check(mutants: list[Mutant]) -> list[str]:
    """Problems with the list: an original snippet absent or not unique, a duplicate id."""
    out, ids = [], set()
    for m in mutants:
        if m.id in ids:
            out.append(f"{m.id}: duplicate id")
        ids.add(m.id)
        path = REPO / m.file
        text = path.read_text() if path.is_file() else ""
        count = text.count(m.original)
        if count != 1:
            out.append(f"{m.id}: its original snippet occurs {count} times in {m.file} (must be once)")
        if m.original == m.replacement:
            out.append(f"{m.id}: replacement equals the original")
        if not m.tests:
            out.append(f"{m.id}: no tests")
    return out


def scratch_copy() -> Path:
    """The working tree's tracked + untracked-not-ignored files, copied to a temp dir."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    dest = Path(tempfile.mkdtemp(prefix="baton-mutants-"))
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
        elif src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dest / rel)
    return dest


def run_tests(root: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", *tests]
    start = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        rc, tail = 124, f"timed out after {timeout:g}s"
    return rc, time.perf_counter() - start, tail


def first_failure(tail: str) -> str:
    for line in tail.splitlines():
        if line.startswith(("FAILED", "ERROR")) or line.startswith("E "):
            return line.strip()[:160]
    return tail.strip().splitlines()[-1][:160] if tail.strip() else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    ap.add_argument("--smoke", action="store_true", help=f"run the smoke set only: {', '.join(SMOKE)}")
    ap.add_argument("--list", action="store_true", help="print the list and exit")
    ap.add_argument("--check", action="store_true", help="check the list against the code and exit")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per pytest run (a timeout is a kill)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)

    problems = check(MUTANTS)
    if args.check or problems:
        for p in problems:
            print(p, file=sys.stderr)
        if not problems:
            print(f"{len(MUTANTS)} mutants, every snippet present once")
        return 2 if problems else 0
    chosen = MUTANTS
    if args.smoke:
        chosen = [m for m in MUTANTS if m.id in SMOKE]
    if args.only:
        unknown = set(args.only) - {m.id for m in MUTANTS}
        if unknown:
            print(f"unknown mutant id(s): {sorted(unknown)}", file=sys.stderr)
            return 2
        chosen = [m for m in MUTANTS if m.id in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.id:32s} {m.file}: {m.description}\n{'':32s} tests: {' '.join(m.tests)}")
        return 0

    root = scratch_copy()
    start = time.perf_counter()
    results = []
    try:
        selections = sorted({t for m in chosen for t in m.tests})
        rc, secs, tail = run_tests(root, tuple(selections), args.timeout * 4)
        print(f"baseline: {len(selections)} selections, rc={rc}, {secs:.0f}s", flush=True)
        if rc != 0:
            print(tail, file=sys.stderr)
            print("the unmutated tree fails its selections: fix that first", file=sys.stderr)
            return 1
        for i, m in enumerate(chosen, 1):
            path = root / m.file
            original = path.read_text()
            path.write_text(original.replace(m.original, m.replacement, 1))
            try:
                rc, secs, tail = run_tests(root, m.tests, args.timeout)
            finally:
                path.write_text(original)
            killed = rc != 0
            results.append({**asdict(m), "killed": killed, "rc": rc, "seconds": round(secs, 1),
                            "by": first_failure(tail) if killed else ""})
            print(f"[{i}/{len(chosen)}] {'killed  ' if killed else 'SURVIVED'} {m.id:32s} {secs:5.0f}s  "
                  f"{results[-1]['by']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = time.perf_counter() - start
    killed = sum(r["killed"] for r in results)
    print(f"\nscore: {killed}/{len(results)} killed ({100 * killed / max(len(results), 1):.0f}%), "
          f"{total:.0f}s in all")
    for r in results:
        if not r["killed"]:
            print(f"  survived: {r['id']} ({r['file']}): {r['description']}")
    if args.out:
        args.out.write_text(json.dumps({"score": [killed, len(results)], "seconds": round(total),
                                        "results": results}, indent=1))
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
