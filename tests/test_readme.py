"""The README's controller example runs and prints what the README says (local and Ray)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


@pytest.mark.ray
@pytest.mark.slow  # ~17 s: a Ray of its own in a subprocess (the controller on Ray: tests/controller)
def test_readme_controller_example(tmp_path):
    text = README.read_text()
    code = re.search(r"## The single controller in a few lines\n\n```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                         env=env, cwd=tmp_path).stdout
    for line in re.findall(r"prints `(.*?)` and `(.*?)`", text)[0]:
        assert line in out, (line, out)
