"""The weight-sync parity check's bound (`baton.trainers.report.step_metrics`): exact for fp32,
for bf16 a bound that grows with the model's depth (the engine's bf16 copy and the trainer's
autocast drift apart layer by layer: bench/bf16_parity_depth.py, BENCHMARKS.md)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from baton.trainers.report.step_metrics import FP32_SYNC_TOL, bf16_sync_tolerance, sync_tolerance


def test_the_bf16_bound_by_depth():
    # 0.04 * sqrt(L), at least 0.1: 4 layers 0.08 -> 0.1; 24 -> 0.196; 28 -> 0.212; 100 -> 0.4
    assert bf16_sync_tolerance(4) == 0.1
    assert bf16_sync_tolerance(24) == pytest.approx(0.04 * math.sqrt(24)) == pytest.approx(0.196, abs=1e-3)
    assert bf16_sync_tolerance(100) == pytest.approx(0.4)
    # above what was measured: H200 0.047 (0.5B, 24 layers) and 0.090 (1.5B, 28); CPU init 0.1: 0.19 (24-32)
    assert bf16_sync_tolerance(24) > 0.19 and bf16_sync_tolerance(28) > 2 * 0.090


def cfg(path: str, bf16, gpus: int = 0, dtype=None):
    import torch

    model = SimpleNamespace(path=path, torch_dtype=dtype or torch.float32)
    return SimpleNamespace(placement=SimpleNamespace(gpus_per_worker=gpus), actor=SimpleNamespace(bf16=bf16),
                           model=model)


def test_the_run_bound_follows_precision_and_depth(tmp_path):
    import torch

    (tmp_path / "config.json").write_text('{"num_hidden_layers": 36}')
    assert sync_tolerance(cfg(str(tmp_path), None)) == FP32_SYNC_TOL  # CPU: fp32
    assert sync_tolerance(cfg(str(tmp_path), None, gpus=1)) == pytest.approx(0.24)  # GPU: bf16, 36 layers
    assert sync_tolerance(cfg(str(tmp_path), None, dtype=torch.bfloat16)) == pytest.approx(0.24)
    assert sync_tolerance(cfg(str(tmp_path), False, gpus=1)) == FP32_SYNC_TOL
