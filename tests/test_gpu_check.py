"""scripts/gpu_check.sh fits the time a GPU machine is lent (one command runs at most 10
minutes, the machine is lent 15 in all, start-up included): its steps' limits, each with the
kill grace `timeout` adds, sum under 6 minutes; its rows print as each step ends; a missing
wheel folder is an error row, not skipped. Run here with a stand-in interpreter (`true`):
what is checked is the script's bookkeeping, not the GPU work (tests/gpu, on a GPU)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"
BUDGET_S = 360


def test_the_worst_case_ends_within_six_minutes():
    text = SCRIPT.read_text()
    limits = [int(x) for x in re.findall(r"^\s*STEP=(\d+); step ", text, re.M)]
    steps = re.findall(r"^\s*(?:STEP=\d+; )?step ", text, re.M)
    assert limits and len(limits) == len(steps), "every step names its limit (STEP=N; step ...)"
    grace = int(re.search(r"^KILL_AFTER=(\d+)", text, re.M).group(1))
    assert '--kill-after="$KILL_AFTER"' in text
    worst = sum(limit + grace for limit in limits)
    assert worst < BUDGET_S, f"every limit hit: {worst} s"


def test_rows_print_as_steps_end_and_a_missing_wheel_folder_is_an_error(tmp_path):
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "PYTHON": "true"})
    lines = p.stdout.splitlines()
    assert lines[0].split()[:2] == ["check", "status"]  # the header first, then a row per step
    assert re.match(r"wheels .* MISSING .*\.whl/ missing", lines[1]), lines[1]
    names = [line[:28].strip() for line in lines[2:] if not line.startswith(("logs:", "torch", "NO CUDA"))]
    assert names == ["environment", "pytest gpu engine+serve", "pytest gpu recipes", "grpo vs trl 5m (smoke)",
                     "grpo vs trl 0.5b 16x8x128", "engine 0.5b bf16 128x256"], lines
    assert p.returncode == 1  # a row that is not ok fails the check
    assert len(list(tmp_path.iterdir())) <= 8  # what the device tool brings back
