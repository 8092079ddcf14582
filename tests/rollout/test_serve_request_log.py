"""`baton serve --log-requests` prints one line per request on stderr (its logger had no
handler, so the lines went nowhere): the real command in a subprocess, real HTTP on 127.0.0.1,
the shipped demo checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~4 s quiet, 75 s on a loaded 2-core box; the default run has the in-process form
def test_log_requests_prints_a_line_per_request():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "serve", str(REPO / "checkpoints/arith-sft"),
                             "--port", "0", "--log-requests", "--threads", "1"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stdout:  # the start line names the port
            if " on http://" in line:
                url = line.split(" on ")[1].split()[0]
                break
        assert url, proc.stderr.read()
        with httpx.Client(base_url=url, timeout=120) as c:
            r = c.post("/v1/completions", json={"prompt": "1+2=", "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
            assert c.get("/v1/models/nope").status_code == 404
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if "baton.serve" in ln]
    assert any("POST /v1/completions 200" in ln and "tokens" in ln for ln in lines), err[-2000:]
    assert any("GET /v1/models/nope 404" in ln for ln in lines), err[-2000:]
