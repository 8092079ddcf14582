"""scripts/same_metrics.py, the refactor check (issue 31: every recipe's first steps give the
same metrics before and after): its comparison ignores wall-clock keys and nothing else."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("same_metrics", REPO / "scripts" / "same_metrics.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def side(root: Path, rows: list[dict]) -> Path:
    (root / "grpo_arithmetic" / "run").mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"recipes": {"grpo_arithmetic": {"rc": 0}}}))
    (root / "grpo_arithmetic" / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_wall_clock_keys_are_ignored_and_every_other_difference_is_caught(tmp_path):
    sm = load_script()
    ignored = [re.compile(p) for p in sm.IGNORED]
    base = side(tmp_path / "base", [{"step": 1, "reward/mean": 0.5, "timing/step_s": 1.0,
                                     "throughput/tokens_per_s": 10.0}])
    same = side(tmp_path / "same", [{"step": 1, "reward/mean": 0.5, "timing/step_s": 2.0,
                                     "throughput/tokens_per_s": 20.0}])
    other = side(tmp_path / "other", [{"step": 1, "reward/mean": 0.5 + 1e-12, "timing/step_s": 1.0,
                                       "throughput/tokens_per_s": 10.0, "new/key": 1}])
    row = sm.compare_recipe("grpo_arithmetic", base, same, ignored)
    assert row["ok"] and row["keys"] == 1 and row["status"] == "same"
    row = sm.compare_recipe("grpo_arithmetic", base, other, ignored)
    assert not row["ok"] and row["differ"] == 2 and {k for _, k, _, _ in row["diffs"]} == {"reward/mean", "new/key"}
