"""The start checks of a data file stream its rows (issue 50.10: a 2M-row file took 2.7 GB
and 39 s of CPU to check, 1.6 GB before): each row is normalised once and not kept, so the
check holds no more than the parsed file the driver reads anyway (`read_records`' cache).
Measured with tracemalloc (allocations, not time: deterministic for a given input)."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

from baton.config import load_config
from baton.data import records as R
from baton.trainers.ppo_config import PPOConfig
from baton.trainers.session import inputs
from baton.trainers.session.inputs import check_data

REPO = Path(__file__).resolve().parents[2]


def test_a_large_file_is_checked_row_by_row_holding_only_the_parsed_file(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(20_000):
            a, b = rng.randrange(100), rng.randrange(100)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    cfg = load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml",
                      [f"data.path={path}", f"model.path={REPO / 'checkpoints/arith-sft'}"])
    check_data(cfg)  # warm: the tokenizer, the task's modules
    R._PARSED.clear()
    tracemalloc.start()
    R.read_records(path)
    parsed = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    R._PARSED.clear()
    calls = []
    for module in (R, inputs):  # every row normalised once (before: twice, and every row's prompt listed)
        real = module.normalize_row
        monkeypatch.setattr(module, "normalize_row", lambda *a, real=real, **k: calls.append(1) or real(*a, **k))
    tracemalloc.start()
    check_data(cfg)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(calls) == 20_000
    assert peak < 1.2 * parsed, (peak, parsed)  # before: 1.5x
