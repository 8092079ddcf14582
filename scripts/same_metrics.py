#!/usr/bin/env python3
"""Same metrics before and after a refactor: run every recipe under recipes/ for the first N
steps at a base git revision and at the working tree (head), then compare the two runs'
`metrics.jsonl` step by step, key by key, for exact equality.

A refactor that changes nothing a run computes leaves every recipe's metrics bit for bit the
same on the CPU (fp32 everywhere, seeded: the recipes' `trainer.seed` / `data.seed`, which is
all tests/test_recipe_matrix.py relies on as well; this tool also fixes PYTHONHASHSEED=0).

Usage (from the repository root, with the project's venv):

    # 1. the base, once: a `git worktree add --detach` of REV in a temp dir, each recipe run
    #    from there (PYTHONPATH = the worktree, so `import baton` is the base's code)
    .venv/bin/python scripts/same_metrics.py --base REV --steps 20 --only-run base --out DIR
    # 2. the head: the same recipes from this working tree
    .venv/bin/python scripts/same_metrics.py --steps 20 --only-run head --out DIR
    # 3. the table (no runs); exit 1 if any recipe differs or failed to run
    .venv/bin/python scripts/same_metrics.py --compare --out DIR
    # all three in one go:
    .venv/bin/python scripts/same_metrics.py --base REV --out DIR

Options: `--recipes grpo_arithmetic ppo_arithmetic` (stems or paths) runs / compares a subset;
`--steps N` (default 20; --only-run head reads the base's N from DIR/base/manifest.json when
it is not given); `--timeout S` per recipe (default 1800); `--ignore REGEX` (repeatable)
ignores more keys; `--base-dir A --head-dir B` compares any two result dirs (e.g. two base
runs: the run-to-run check); `--keep-worktree` leaves the base worktree in place.

Layout: DIR/{base,head}/manifest.json (revision, commit, steps, argv, per-recipe exit code and
wall time) and DIR/{base,head}/RECIPE/{run/ (the run dir: metrics.jsonl, checkpoints), log.txt,
cmd.txt}. A side's run of a recipe wipes that recipe's previous result first.

How each recipe runs (as tests/test_recipe_matrix.py runs them, in a subprocess with the same
interpreter, `python -m baton.cli`, cwd = the tree's root, OMP_NUM_THREADS=1,
RAY_AUTH_MODE=disabled, RAY_USAGE_STATS_ENABLED=0, BATON_PLACEMENT_AUTO unset = the default
placement a user gets, PYTHONHASHSEED=0):
  * every recipe: `baton train RECIPE trainer.steps=N trainer.run_dir=DIR/SIDE/RECIPE/run`
    (`baton train` runs the driver the recipe's `algorithm:` names: grpo, ppo, online_dpo,
    dpo, rm, sft; `baton sft RECIPE` is the same command for sft recipes);
  * offline_dpo_arithmetic also `data.path=tests/fixtures/pairs.jsonl` (the recipe asks for its
    pairs on the command line; the matrix's fixture);
  * `data.source: api` recipes (grpo_arithmetic_api, grpo_gsm8k) through `baton launch`
    (API + `baton serve` + `baton env` + trainer) with `data.api_url=http://127.0.0.1:PORT`
    and `data.servers=[http://127.0.0.1:PORT]` on free ports, as the matrix's `_launch` does.
  Everything else (batch sizes, `trainer.eval_every`, `data.eval_size`, `trainer.progress`) is
  the recipe's own, on both sides: the matrix's shrinking overrides are not applied, so the
  steps compared are the recipe's real first N steps, evaluations included (held-out eval at
  step 0 and at step N, plus any `eval_every` step in between).

Keys ignored (wall-clock dependent; re.search on the key; IGNORED below):
  ^(time|timing|timings|timeline|perf|throughput|memory)/
      timing/{rollout,score,update,sync,reference,eval,step}_s, throughput/tokens_per_s,
      timeline/update_overlap and timeline/values_reward_overlap (ppo: how much two roles'
      wall-clock intervals overlap), memory/peak_gib_* (GPU only)
  (_s|_ms|_sec|_secs|_seconds)$ | per_s | seconds | tokens_per | latency | elapsed | wall
Every other key is compared exactly (floats as JSON wrote them; NaN equals NaN). A key present
on one side only is a difference. Lines are merged per `step` (a step's eval may be a line of
its own); lines without a step are compared under step "-".

Run to run (measured: every recipe at 04111cc run twice for 20 steps, each time from a fresh
worktree, on a shared 2-core AMD EPYC under different load; agent_guess a third time):
  * identical on every compared key: agent_calculator, agent_calculator_sft,
    agent_calculator_sft_mixed, agent_guess, grpo_arithmetic, offline_dpo_arithmetic,
    online_dpo_arithmetic, ppo_arithmetic, rm_arithmetic, sft_arithmetic;
  * NOT reproducible: grpo_arithmetic_api and grpo_gsm8k (the data.source=api recipes, run by
    `baton launch`). Their environments' concurrent workers send unseeded /generate requests
    that the server batches in arrival order, so which tokens a group gets depends on thread
    timing; and staleness admission (trainer.max_staleness: 1) lets a group be sampled by the
    policy one version behind or not, depending on timing (rollout/policy_age differs run to
    run). Every sampled row, and all that is trained on it, differs from step 1 on (the
    held-out eval at step N too). For these two (NOT_REPRODUCIBLE below) the table compares
    step 0 (the starting model's held-out eval) in full and, at every step, only the keys that
    do not depend on the rows (actor/lr, actor/nonfinite_skipped, reward/errors,
    reward/timeouts); the rest is counted as "skipped" and the status says "not reproducible
    run to run". (grpo_gsm8k's tiny model scores 0 on every group, so its reward and loss
    keys happen to agree, but they are not compared.)
  * The gateway agent row of the test matrix (agent_calculator with data.source=gateway) is not
    a recipe and is not run here; it is reported not to be reproducible even at one commit.
  * Caveat: the agent recipes' tool / env / trajectory timeouts (agent.*_timeout_s) are
    wall-clock guards; a machine loaded enough to trip one changes that run's metrics
    (reward/timeouts, agent/* counts show it).
`-v` lists every differing key with its first differing step and both values.

Exit status: 0 every recipe ran on both sides and matches; 1 a recipe differs, failed to run
or is missing from a side; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PYTHON = Path(sys.executable)  # the venv's interpreter runs both sides

IGNORED = [
    r"^(time|timing|timings|timeline|perf|throughput|memory)/",
    r"(_s|_ms|_sec|_secs|_seconds)$",
    r"per_s",
    r"seconds",
    r"tokens_per",
    r"latency",
    r"elapsed",
    r"wall",
]

_API = ("data.source=api: the environments' concurrent workers send unseeded /generate requests that the "
        "server batches in arrival order (which tokens each group gets depends on thread timing), and "
        "staleness admission lets a group be sampled by the policy one version behind or not depending on "
        "timing (rollout/policy_age varies); so every sampled row, and everything trained on it, differs "
        "from step 1 on. Compared: step 0 (the starting model's held-out eval) in full, and at every step "
        "only the keys that do not depend on the rows")
_API_KEYS = [r"^actor/lr$", r"^actor/nonfinite_skipped$", r"^reward/(errors|timeouts)$"]

# recipe stem -> (why, the key regexes still reproducible at every step). Step 0 (the held-out
# eval of the starting model, before any sampled row) is compared in full; the other keys of the
# other steps are skipped (neither values nor presence compared: rollout/behaviour_kl, for one,
# is logged only at steps that had stale groups).
NOT_REPRODUCIBLE: dict[str, tuple[str, list[str]]] = {
    "grpo_arithmetic_api": (_API, _API_KEYS),
    "grpo_gsm8k": (_API, _API_KEYS),
}

EXTRA = {"offline_dpo_arithmetic": ["data.path=tests/fixtures/pairs.jsonl"]}


# --- running ----------------------------------------------------------------------------
def _recipe_yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recipe_command(root: Path, recipe: str, steps: int, run_dir: Path) -> list[str]:
    """The command that runs `recipe` (a stem) from tree `root` for `steps` steps into `run_dir`."""
    y = _recipe_yaml(root / "recipes" / f"{recipe}.yaml")
    common = [f"trainer.steps={steps}", f"trainer.run_dir={run_dir}", *EXTRA.get(recipe, [])]
    if (y.get("data") or {}).get("source") == "api":
        return [str(PYTHON), "-m", "baton.cli", "launch", f"recipes/{recipe}.yaml", *common,
                f"data.api_url=http://127.0.0.1:{_free_port()}", f"data.servers=[http://127.0.0.1:{_free_port()}]"]
    return [str(PYTHON), "-m", "baton.cli", "train", f"recipes/{recipe}.yaml", *common]


def run_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BATON_PLACEMENT_AUTO", "BATON_USER_PATH")}
    env.update(PYTHONPATH=str(root), OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               PYTHONHASHSEED="0", PYTHONUNBUFFERED="1")
    return env


def check_import(root: Path) -> str:
    """`baton.__file__` as the runs will import it; exits if it is not `root`'s."""
    p = subprocess.run([str(PYTHON), "-c", "import baton; print(baton.__file__)"], cwd=root, env=run_env(root),
                       capture_output=True, text=True)
    where = p.stdout.strip()
    print(f"  baton imported from {where}")
    if p.returncode != 0 or not Path(where).resolve().is_relative_to(root.resolve()):
        sys.exit(f"same_metrics: `import baton` in {root} gave {where!r} {p.stderr[-500:]}")
    return where


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def run_side(side: str, root: Path, recipes: list[str], steps: int, out: Path, timeout: float,
             meta: dict[str, Any]) -> None:
    """Run `recipes` from tree `root` into out/side/; record each in out/side/manifest.json."""
    side_dir = out / side
    side_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = side_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if manifest.get("steps") not in (None, steps) or (side == "base" and manifest.get("commit") not in
                                                       (None, meta["commit"])):
        manifest = {}  # another step count or base revision: its recipes would not compare
    manifest.update(meta, steps=steps, argv=sys.argv)
    manifest.setdefault("recipes", {})
    manifest["baton_file"] = check_import(root)
    env = run_env(root)
    for recipe in recipes:
        rdir = side_dir / recipe
        shutil.rmtree(rdir, ignore_errors=True)
        rdir.mkdir(parents=True)
        if not (root / "recipes" / f"{recipe}.yaml").exists():
            (rdir / "cmd.txt").write_text(f"(no recipes/{recipe}.yaml in {root})\n")
            manifest["recipes"][recipe] = {"rc": "no such recipe", "wall_s": 0.0}
            manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
            print(f"  [{side}] {recipe}: no recipes/{recipe}.yaml in {root}", flush=True)
            continue
        cmd = recipe_command(root, recipe, steps, rdir / "run")
        (rdir / "cmd.txt").write_text(" ".join(cmd) + f"\n(cwd {root})\n")
        print(f"  [{side}] {recipe}: {' '.join(cmd[3:])}", flush=True)
        t0 = time.monotonic()
        with open(rdir / "log.txt", "w") as log:
            p = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGTERM)  # the run's own process group (launch's services too)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                rc = "timeout"
        wall = time.monotonic() - t0
        manifest["recipes"][recipe] = {"rc": rc, "wall_s": round(wall, 1)}
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
        print(f"  [{side}] {recipe}: exit {rc}, {wall:.0f} s" + ("" if rc == 0 else f" (log: {rdir / 'log.txt'})"),
              flush=True)


def run_base(rev: str, recipes: list[str] | None, steps: int, out: Path, timeout: float, keep: bool) -> None:
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tmp = Path(tempfile.mkdtemp(prefix="same_metrics_base_"))
    tree = tmp / "tree"
    print(f"base: {rev} = {commit[:12]}, worktree {tree}")
    git("worktree", "add", "--detach", str(tree), commit)
    try:
        run_side("base", tree, recipes or all_recipes(tree), steps, out, timeout,
                 {"side": "base", "rev": rev, "commit": commit, "tree": str(tree)})
    finally:
        if keep:
            print(f"base worktree kept: {tree} (git worktree remove --force {tree})")
        else:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO)
            shutil.rmtree(tmp, ignore_errors=True)


def run_head(recipes: list[str] | None, steps: int, out: Path, timeout: float) -> None:
    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    print(f"head: working tree {REPO} (HEAD {commit[:12]}{', with changes' if dirty else ''})")
    run_side("head", REPO, recipes or all_recipes(REPO), steps, out, timeout,
             {"side": "head", "rev": "working tree", "commit": commit, "dirty": dirty, "tree": str(REPO)})


def all_recipes(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "recipes").glob("*.yaml"))


# --- comparing --------------------------------------------------------------------------
def read_steps(path: Path) -> dict[Any, dict[str, Any]]:
    """metrics.jsonl as {step: {key: value}}, a step's lines merged (a torn last line skipped)."""
    steps: dict[Any, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = row.pop("step", "-")
        steps.setdefault(step, {}).update(row)
    return steps


def _same(a: Any, b: Any) -> bool:
    """Exactly equal (a number as a number: 1 == 1.0; NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare_recipe(recipe: str, base_dir: Path, head_dir: Path, ignored: list[re.Pattern]) -> dict[str, Any]:
    """One table row: steps/keys compared, keys differing, the first difference, a status;
    `diffs`: every (step, key, base value, head value) that differs."""
    unstable = recipe in NOT_REPRODUCIBLE
    stable = [re.compile(p) for p in NOT_REPRODUCIBLE.get(recipe, ("", []))[1]]
    row: dict[str, Any] = {"recipe": recipe, "steps": 0, "keys": 0, "differ": 0, "skipped": 0, "first": "",
                           "status": "same", "ok": True, "diffs": []}
    for side, d in (("base", base_dir), ("head", head_dir)):
        info = (json.loads((d / "manifest.json").read_text()).get("recipes", {}).get(recipe)
                if (d / "manifest.json").exists() else None)
        if info is None:
            return {**row, "status": f"not run on {side}", "ok": False}
        if info["rc"] != 0:
            return {**row, "status": f"{side} failed (exit {info['rc']}, {d / recipe / 'log.txt'})", "ok": False}
        if not (d / recipe / "run" / "metrics.jsonl").exists():
            return {**row, "status": f"{side} wrote no metrics.jsonl", "ok": False}
    a = read_steps(base_dir / recipe / "run" / "metrics.jsonl")
    b = read_steps(head_dir / recipe / "run" / "metrics.jsonl")
    diffs: list[tuple[Any, str, Any, Any]] = []
    keys: set[str] = set()
    skipped: set[str] = set()
    for step in sorted(set(a) | set(b), key=lambda s: (isinstance(s, str), s)):
        if step not in a or step not in b:
            diffs.append((step, "(step)", "present" if step in a else "missing", "present" if step in b else "missing"))
            continue
        for key in sorted(set(a[step]) | set(b[step])):
            if any(p.search(key) for p in ignored):
                continue
            if unstable and step != 0 and not any(p.search(key) for p in stable):
                skipped.add(key)
                continue
            keys.add(key)
            va, vb = a[step].get(key, "(missing)"), b[step].get(key, "(missing)")
            if not _same(va, vb):
                diffs.append((step, key, va, vb))
    row.update(steps=len(set(a) & set(b)), keys=len(keys), differ=len({k for _, k, _, _ in diffs}),
               skipped=len(skipped - keys), diffs=diffs)
    if diffs:
        step, key, va, vb = diffs[0]
        row.update(first=f"step {step} {key}: {va!r} vs {vb!r}", status="DIFFERENT", ok=False)
    if unstable:
        row["status"] += " (not reproducible run to run: step 0 + row-independent keys only)"
    return row


def compare(base_dir: Path, head_dir: Path, recipes: list[str] | None, extra_ignored: list[str],
            verbose: bool = False) -> int:
    ignored = [re.compile(p) for p in IGNORED + extra_ignored]
    names = recipes
    if names is None:
        names = sorted({p.parent.name for d in (base_dir, head_dir) for p in d.glob("*/cmd.txt")})
    for d in (base_dir, head_dir):
        m = d / "manifest.json"
        if m.exists():
            info = json.loads(m.read_text())
            print(f"{d}: {info.get('side')} {info.get('rev')} {str(info.get('commit', ''))[:12]}"
                  f"{' (with changes)' if info.get('dirty') else ''}, {info.get('steps')} steps")
    rows = [compare_recipe(r, base_dir, head_dir, ignored) for r in names]
    header = ("recipe", "steps", "keys", "differ", "skipped", "status", "first difference")
    table = [header] + [(r["recipe"], str(r["steps"]), str(r["keys"]), str(r["differ"]), str(r["skipped"]),
                         r["status"], r["first"]) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(header) - 1)]
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)) + "  " + t[-1])
    for r in rows:
        if verbose and r["diffs"]:
            first: dict[str, tuple[Any, Any, Any]] = {}
            for step, key, va, vb in r["diffs"]:
                first.setdefault(key, (step, va, vb))
            print(f"{r['recipe']}: {len(first)} keys differ (first step each):")
            for key, (step, va, vb) in first.items():
                print(f"    {key:40s} step {step}: {va!r} vs {vb!r}")
    if any(r["recipe"] in NOT_REPRODUCIBLE for r in rows):
        unstable = ", ".join(r["recipe"] for r in rows if r["recipe"] in NOT_REPRODUCIBLE)
        print(f"not reproducible run to run ({unstable}): {_API}")
    bad = [r["recipe"] for r in rows if not r["ok"]]
    print("same metrics" if not bad and rows else f"NOT the same: {', '.join(bad) or 'no recipes compared'}")
    return 0 if rows and not bad else 1


# --- command line -------------------------------------------------------------------------
def _stems(recipes: list[str] | None) -> list[str] | None:
    return None if not recipes else [Path(r).stem for r in recipes]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="see the module docstring (scripts/same_metrics.py) for details")
    p.add_argument("--base", metavar="REV", help="the git revision to compare against (needed to run the base)")
    p.add_argument("--steps", type=int, default=None, help="steps per recipe (default 20)")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "same_metrics",
                   help="results dir (default: /tmp/same_metrics): OUT/base, OUT/head")
    p.add_argument("--recipes", nargs="+", metavar="RECIPE", help="a subset (stems or paths; default every recipe)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--only-run", choices=["base", "head"], help="run that side only; no comparison")
    mode.add_argument("--compare", action="store_true", help="compare OUT/base and OUT/head only; no runs")
    p.add_argument("--base-dir", type=Path, help="compare this dir as the base (default OUT/base)")
    p.add_argument("--head-dir", type=Path, help="compare this dir as the head (default OUT/head)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per recipe run (default 1800)")
    p.add_argument("--ignore", action="append", default=[], metavar="REGEX", help="also ignore keys matching")
    p.add_argument("--keep-worktree", action="store_true", help="leave the base's git worktree in place")
    p.add_argument("-v", "--verbose", action="store_true", help="list every differing key (its first step)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    recipes = _stems(args.recipes)
    if args.steps is None:  # the head and a comparison default to the base's step count
        m = out / "base" / "manifest.json"
        args.steps = json.loads(m.read_text()).get("steps", 20) if m.exists() and args.only_run != "base" else 20
    if not args.compare and args.only_run != "head":
        if not args.base:
            p.error("--base REV is needed to run the base (or use --only-run head / --compare)")
        run_base(args.base, recipes, args.steps, out, args.timeout, args.keep_worktree)
    if not args.compare and args.only_run != "base":
        if recipes is None and (out / "base" / "manifest.json").exists():
            recipes = sorted(json.loads((out / "base" / "manifest.json").read_text())["recipes"])
        run_head(recipes, args.steps, out, args.timeout)
    if args.only_run:
        return 0
    return compare((args.base_dir or out / "base").resolve(), (args.head_dir or out / "head").resolve(), recipes,
                   args.ignore, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
