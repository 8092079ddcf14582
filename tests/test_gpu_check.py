"""scripts/gpu_check.sh fits the time a GPU machine is lent (one command runs at most 10
minutes, the machine is lent 15 in all, start-up included), and each step fits its work:
every limit is at least its estimate (the step's work over the rates in the script's header,
written on the `# estimate:` line above it) times the margin written there; the limits, each
with the kill grace `timeout` adds, sum under 6 minutes; every file of tests/gpu is run; its
rows print as each step ends; a missing wheel folder is an error row, not skipped. Run here with
a stand-in interpreter (`true`): what is checked is the script's bookkeeping, not the GPU work
(tests/gpu, on a GPU)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
BUDGET_S = 360
SOURCES = ("h200", "cpu", "assumed")  # where a rate comes from (the script's header)


def rates(text: str) -> dict[str, float]:
    found = re.findall(r"^# rate: (\w+) = ([\d.]+) \S+ \((\w+)[ :)]", text, re.M)
    assert found and all(src in SOURCES for _, _, src in found), found
    return {name: float(value) for name, value, _ in found}


def steps(text: str) -> list[tuple[str, int, float, float]]:
    """(name, limit, estimate, margin) of each step, the estimate from the rates."""
    rate, out, pending = rates(text), [], None
    for line in text.splitlines():
        m = re.match(r"\s*# estimate: (.+); margin ([\d.]+)$", line)
        if m:
            pending = (eval(m.group(1), {"__builtins__": {}}, rate), float(m.group(2)))  # names: the rates
            continue
        m = re.match(r'\s*STEP=(\d+); step "([^"]+)"', line)
        if m:
            assert pending is not None, f"step {m.group(2)!r}: no `# estimate:` line above it"
            out.append((m.group(2), int(m.group(1)), *pending))
            pending = None
    return out


def test_every_limit_covers_its_estimate_and_the_worst_case_ends_within_six_minutes():
    text = SCRIPT.read_text()
    found = steps(text)
    assert len(found) == len(re.findall(r"^\s*(?:STEP=\d+; )?step ", text, re.M)), "every step names its limit"
    short = [(name, limit, round(est * margin, 1)) for name, limit, est, margin in found if limit < est * margin]
    assert not short, f"limits below estimate x margin: {short}"
    assert all(margin >= 1.2 for *_, margin in found)
    grace = int(re.search(r"^KILL_AFTER=(\d+)", text, re.M).group(1))
    assert '--kill-after="$KILL_AFTER"' in text
    worst = sum(limit + grace for _, limit, _, _ in found)
    assert worst < BUDGET_S, f"every limit hit: {worst} s"


def test_an_estimate_below_its_limit_fails():
    text = SCRIPT.read_text().replace("STEP=35;", "STEP=20;")
    assert any(limit < est * margin for _, limit, est, margin in steps(text))


def test_every_file_of_tests_gpu_is_run_and_pytest_names_each_test():
    text = SCRIPT.read_text()
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    assert files and all(f in text for f in files), sorted(f for f in files if f not in text)
    assert re.search(r"-m pytest -v ", text)  # a killed step's log still lists the tests that ended


def test_rows_print_as_steps_end_and_a_missing_wheel_folder_is_an_error(tmp_path):
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "PYTHON": "true"})
    lines = p.stdout.splitlines()
    assert lines[0].split()[:2] == ["check", "status"]  # the header first, then a row per step
    assert re.match(r"wheels .* MISSING .*\.whl/ missing", lines[1]), lines[1]
    names = [line[:28].strip() for line in lines[2:] if not line.startswith(("logs:", "torch", "NO CUDA"))]
    assert names == ["environment", "pytest gpu engine+serve+...", "pytest gpu recipes", "grpo vs trl 0.5b 16x8x128",
                     "engine 0.5b bf16 128x256"], lines
    assert p.returncode == 1  # a row that is not ok fails the check
    assert len(list(tmp_path.iterdir())) <= 8  # what the device tool brings back
