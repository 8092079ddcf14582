"""`baton eval` and `baton serve` on the GPU (marked `gpu`: skipped without CUDA).

`baton eval` places the checkpoint on the GPU when there is one; `baton serve --device auto`
(its default) serves from it, here in bf16: a completion comes back with finite logprobs.
Written without a GPU at hand: the first run on an H200 is owed (scripts/gpu_check.sh).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from baton.cli import main

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "checkpoints" / "arith-sft"


def test_eval_runs_on_the_gpu(monkeypatch, capsys):
    from baton.models import load as load_mod

    seen = []
    real = load_mod.load_model
    monkeypatch.setattr(load_mod, "load_model",
                        lambda *a, **k: seen.append(torch.device(k.get("device", "cpu")).type) or real(*a, **k))
    assert main(["eval", str(CKPT), "--n", "8"]) == 0
    assert seen == ["cuda"]
    assert "greedy" in capsys.readouterr().out


def test_serve_answers_from_the_gpu(tmp_path):
    log = tmp_path / "serve.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "serve", str(CKPT), "--port", "0",
                                 "--dtype", "bfloat16"], stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        url = None
        for _ in range(240):  # start-up: model load + CUDA context
            m = re.search(r"on (http://[\d.]+:\d+) \((cuda[:\d]*), bfloat16\)", log.read_text())
            if m:
                url = m.group(1)
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.5)
        assert url, log.read_text()
        body = json.dumps({"model": "arith-sft", "prompt": "12+34=", "max_tokens": 4, "temperature": 0,
                           "logprobs": 1}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=60).read())
        choice = out["choices"][0]
        assert choice["text"]
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        assert all(math.isfinite(x) for x in lps)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
