"""A full disk at checkpoint time (issue 22 §5): the old checkpoint stays intact and the
error is one line naming ENOSPC and the path, not a C++ iostream traceback.

Two forms: a real 1 MiB tmpfs (needs root to mount; skipped otherwise) that torch.save and
safetensors really fill, and a write patched to raise OSError(ENOSPC) (runs everywhere)."""

from __future__ import annotations

import errno
import subprocess
import uuid

import pytest
import torch
from safetensors.torch import save_file

from baton.runs.checkpoints import DiskFullError, atomic_dir


@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / f"fs{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    r = subprocess.run(["umount", "-l", str(mnt)], capture_output=True)  # lazy: a failed writer may hold an fd
    assert r.returncode == 0, r.stderr


def _check_full(exc: DiskFullError, final) -> None:
    msg = str(exc)
    assert "\n" not in msg and "ENOSPC" in msg and str(final) in msg, msg
    assert exc.errno == errno.ENOSPC and exc.__suppress_context__


@pytest.mark.parametrize("writer", ["torch", "safetensors"])
def test_a_real_full_disk_is_one_line_and_keeps_the_old_checkpoint(tiny_fs, writer):
    final = tiny_fs / "step_1"
    with atomic_dir(final) as tmp:
        (tmp / "ok.txt").write_text("old")
    big = {"w": torch.zeros(512 * 1024)}  # 2 MiB > the 1 MiB disk
    with pytest.raises(DiskFullError) as info:
        with atomic_dir(final) as tmp:
            if writer == "torch":
                torch.save(big, tmp / "trainer_state.pt")
            else:
                save_file(big, str(tmp / "model.safetensors"))
    _check_full(info.value, final)
    assert (final / "ok.txt").read_text() == "old"
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["step_1"]  # no temp dir left behind


def test_enospc_from_any_write_is_one_line(tmp_path, monkeypatch):
    final = tmp_path / "step_2"
    with pytest.raises(DiskFullError) as info:
        with atomic_dir(final) as tmp:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "x"))
    _check_full(info.value, final)
    with pytest.raises(ValueError):  # other errors pass through unchanged
        with atomic_dir(final):
            raise ValueError("not a disk problem")
