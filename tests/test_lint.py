"""ruff with pyflakes and bugbear (pyproject.toml's [tool.ruff]) over the package, the tests and
the benchmarks: an unused import, an undefined name or a bugbear finding fails the default run."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the test extra: pip install -e '.[cpu,test]'"
    p = subprocess.run([ruff, "check", "--output-format", "concise", "baton", "tests", "bench"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
