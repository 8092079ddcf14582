"""baton.runs.checkpoints: atomic saves that survive a crash at any step, completeness
checks that name what is wrong, falling back past broken checkpoints, pruning."""

import json
import logging
import os
import shutil
import signal
import subprocess
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from runs_helpers import PYTHON, child_env, version_of, wait_child, write_checkpoint
from safetensors.numpy import save_file

from baton.runs import checkpoints as ck
from baton.runs.checkpoints import (
    atomic_dir, check_checkpoint, is_complete, latest_complete_checkpoint, list_checkpoints,
    prune_checkpoints, recover_checkpoints,
)

CRASHED = 99


def _ckpts(run: Path) -> Path:
    return run / "checkpoints"


def _entries(run: Path) -> list[str]:
    return sorted(p.name for p in _ckpts(run).iterdir())


# --- atomic_dir without crashes -----------------------------------------------------------
def test_atomic_dir_publishes_and_replaces(tmp_path):
    final = _ckpts(tmp_path) / "step_1"
    with atomic_dir(final) as tmp:
        assert tmp.parent == final.parent and tmp.name.startswith("step_1.tmp") and not final.exists()
        write_checkpoint(tmp, "v1")
    assert version_of(final) == "v1" and is_complete(final)
    with atomic_dir(final) as tmp:
        write_checkpoint(tmp, "v2")
    assert version_of(final) == "v2" and _entries(tmp_path) == ["step_1"]
    umask = os.umask(0)
    os.umask(umask)
    assert final.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700


def test_atomic_dir_failure_leaves_the_old_checkpoint(tmp_path):
    final = write_checkpoint(_ckpts(tmp_path) / "step_1", "v1")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_dir(final) as tmp:
            write_checkpoint(tmp, "v2")
            raise RuntimeError("disk full")
    assert version_of(final) == "v1" and _entries(tmp_path) == ["step_1"]


def test_atomic_dir_failed_rename_puts_the_old_one_back(tmp_path, monkeypatch):
    final = write_checkpoint(_ckpts(tmp_path) / "step_1", "v1")
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # final -> final.old worked; tmp -> final fails
            raise OSError("EIO")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError, match="EIO"):
        with atomic_dir(final) as tmp:
            write_checkpoint(tmp, "v2")
    monkeypatch.undo()
    assert version_of(final) == "v1" and _entries(tmp_path) == ["step_1"]


def test_atomic_dir_undeletable_old_copy_is_cleaned_at_next_start(tmp_path, monkeypatch, caplog):
    final = write_checkpoint(_ckpts(tmp_path) / "step_1", "v1")
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: (_ for _ in ()).throw(PermissionError("busy")))
    with caplog.at_level(logging.WARNING, logger="baton.runs"):
        with atomic_dir(final) as tmp:
            write_checkpoint(tmp, "v2")
    monkeypatch.undo()
    assert version_of(final) == "v2" and "could not delete the previous checkpoint" in caplog.text
    assert any(".old" in n for n in _entries(tmp_path))
    actions = recover_checkpoints(tmp_path)
    assert _entries(tmp_path) == ["step_1"] and version_of(final) == "v2"
    assert any("previous copy of a completed save" in a for a in actions)


# --- crash at every step ------------------------------------------------------------------
_PRIMITIVES = ("mkdir", "replace", "fsync", "unlink", "rmdir")


def _install_counter(on_call):
    """Wrap the os primitives atomic_dir and shutil.rmtree use; `on_call(name)` runs before each."""
    for name in _PRIMITIVES:
        real = getattr(os, name)

        def wrapper(*a, _real=real, _name=name, **k):
            on_call(_name)
            return _real(*a, **k)

        setattr(os, name, wrapper)


def _save(final: Path, version: str, on_call) -> None:
    with atomic_dir(final) as tmp:
        write_checkpoint(tmp, version, after_file=lambda: on_call("file"))


def _layout(run: Path, existing: bool) -> Path:
    write_checkpoint(_ckpts(run) / "step_0", "v0")  # an older checkpoint, never touched
    if existing:
        write_checkpoint(_ckpts(run) / "step_1", "v1")  # the one the save replaces
    return run


def _count_steps(tmp_path: Path, existing: bool) -> int:
    run = _layout(tmp_path / "count", existing)
    seen = []
    pid = os.fork()
    if pid == 0:  # count in a child: the wrappers are never installed in the test process
        try:
            _install_counter(seen.append)
            _save(_ckpts(run) / "step_1", "v2", seen.append)
            os._exit(min(len(seen), 250))
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    return wait_child(pid)


def _crash_at(run: Path, k: int) -> int:
    """Fork; the child saves v2 into step_1 and dies (os._exit, no cleanup) just before
    primitive call / file write number k."""
    pid = os.fork()
    if pid == 0:
        try:
            n = [0]

            def on_call(_name):
                if n[0] == k:
                    os._exit(CRASHED)
                n[0] += 1

            _install_counter(on_call)
            _save(_ckpts(run) / "step_1", "v2", on_call)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    return wait_child(pid)


@pytest.mark.parametrize("existing", [True, False], ids=["replacing", "first-save"])
def test_a_crash_at_any_step_leaves_a_loadable_checkpoint(tmp_path, existing):
    steps = _count_steps(tmp_path, existing)
    assert 15 < steps < 250, steps  # 5 file writes, mkdir, ~10 fsyncs, 1-2 renames, the rmtree
    outcomes = []
    for k in range(steps + 1):  # k == steps: no crash
        run = _layout(tmp_path / f"crash{k}", existing)
        code = _crash_at(run, k)
        assert code == (CRASHED if k < steps else 0), (k, code)
        recover_checkpoints(run)
        latest, skipped = latest_complete_checkpoint(run)
        assert skipped == [], (k, skipped)
        assert _entries(run) == (["step_0", "step_1"] if latest.name == "step_1" else ["step_0"]), (k, _entries(run))
        outcomes.append(version_of(latest))
    # Old until the commit rename, new from then on; never anything else.
    first_new = outcomes.index("v2")
    assert outcomes[first_new:] == ["v2"] * (len(outcomes) - first_new)
    assert outcomes[:first_new] == ["v1" if existing else "v0"] * first_new and first_new > 10


_KILL_LOOP = """
import itertools, sys
from pathlib import Path
from runs_helpers import write_checkpoint
from baton.runs.checkpoints import atomic_dir
final = Path(sys.argv[1]) / "checkpoints" / "step_1"
print("ready", flush=True)
for i in itertools.count(2):
    with atomic_dir(final) as tmp:
        write_checkpoint(tmp, f"v{i}")
"""


def test_sigkill_during_repeated_saves_leaves_a_loadable_checkpoint(tmp_path):
    write_checkpoint(_ckpts(tmp_path) / "step_1", "v1")
    env = child_env()
    env["PYTHONPATH"] = str(Path(__file__).parent) + os.pathsep + env["PYTHONPATH"]
    versions = []
    for delay in (0.0, 0.03, 0.07, 0.15, 0.3):
        proc = subprocess.Popen([PYTHON, "-c", _KILL_LOOP, str(tmp_path)], env=env,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()
        recover_checkpoints(tmp_path)
        latest, skipped = latest_complete_checkpoint(tmp_path)
        assert latest is not None and latest.name == "step_1" and skipped == []
        assert _entries(tmp_path) == ["step_1"]
        versions.append(version_of(latest))
    assert versions[-1] != "v1", versions  # saves did happen in between


def test_recover_restores_old_copy_when_final_is_missing(tmp_path):
    ckpts = _ckpts(tmp_path)
    write_checkpoint(ckpts / "step_3.old4242", "v1")  # moved aside, then crash before tmp -> final
    write_checkpoint(ckpts / "step_3.tmp4242", "v2")
    write_checkpoint(ckpts / "step_2", "v0")
    write_checkpoint(ckpts / "step_2.old17", "stale")  # final present: a completed save's old copy
    write_checkpoint(ckpts / "step_1.del9", "pruned")  # an interrupted prune: never restored
    actions = recover_checkpoints(tmp_path)
    assert _entries(tmp_path) == ["step_2", "step_3"]
    assert version_of(ckpts / "step_3") == "v1" and version_of(ckpts / "step_2") == "v0"
    text = "\n".join(actions)
    assert "restored" in text and "step_3.old4242" in text and "step_3.tmp4242" in text
    assert "step_1.del9" in text and "interrupted prune" in text
    assert recover_checkpoints(tmp_path) == []  # idempotent


def test_recover_understands_save_pretrained_leftovers(tmp_path):
    # baton.models.load.save_pretrained moves the old dir to `.NAME.old-XXXX/ckpt`.
    ckpts = _ckpts(tmp_path)
    write_checkpoint(ckpts / ".step_5.old-abc123" / "ckpt", "v1")
    (ckpts / ".step_5.tmp-def456").mkdir()
    recover_checkpoints(tmp_path)
    assert _entries(tmp_path) == ["step_5"] and version_of(ckpts / "step_5") == "v1"


# --- completeness -------------------------------------------------------------------------
def test_complete_checkpoint_passes(tmp_path):
    d = write_checkpoint(tmp_path / "c")
    assert check_checkpoint(d) is None and is_complete(d)


@pytest.mark.parametrize("damage, reason", [
    (lambda d: (d / "model.safetensors").write_bytes(b""), "model.safetensors is empty (0 bytes)"),
    (lambda d: (d / "trainer_state.pt").unlink(), "missing trainer_state.pt"),
    (lambda d: (d / "trainer_state.pt").write_bytes(b""), "trainer_state.pt is empty"),
    (lambda d: (d / "trainer_state.pt").write_bytes((d / "trainer_state.pt").read_bytes()[:-30]),
     "trainer_state.pt: not a complete torch.save archive"),
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-16]),
     "model.safetensors: unreadable safetensors"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\0" * 4096), "model.safetensors: unreadable safetensors"),
    (lambda d: (d / "config.json").write_text('{"model_type": "qw'), "config.json: not valid JSON"),
    (lambda d: (d / "config.json").unlink(), "missing config.json"),
    (lambda d: (d / "tokenizer.json").unlink(), "missing all of tokenizer.json"),
    (lambda d: (d / "model.safetensors").unlink(), "missing all of model.safetensors, model.safetensors.index.json"),
], ids=["0-byte-weights", "no-trainer-state", "0-byte-trainer-state", "torn-trainer-state",
        "torn-weights", "zeroed-weights", "torn-config", "no-config", "no-tokenizer", "no-weights"])
def test_incomplete_checkpoint_reasons(tmp_path, damage, reason):
    d = write_checkpoint(tmp_path / "c")
    damage(d)
    got = check_checkpoint(d)
    assert got is not None and got.startswith(reason), got
    assert not is_complete(d)


def test_missing_directory(tmp_path):
    assert check_checkpoint(tmp_path / "nope") == "does not exist"


def test_sharded_weights(tmp_path):
    d = write_checkpoint(tmp_path / "c")
    (d / "model.safetensors").unlink()
    shards = {"model-00001-of-00002.safetensors": "a", "model-00002-of-00002.safetensors": "b"}
    for name, key in shards.items():
        save_file({key: np.zeros((4,), np.float32)}, str(d / name))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {v: k for k, v in shards.items()}}))
    assert check_checkpoint(d) is None
    (d / "model-00002-of-00002.safetensors").unlink()
    assert "lists missing shard(s): model-00002-of-00002.safetensors" in check_checkpoint(d)


def test_alternatives_and_custom_required(tmp_path):
    d = write_checkpoint(tmp_path / "c")
    (d / "tokenizer.json").rename(d / "vocab.json")  # a slow BPE tokenizer's files
    assert check_checkpoint(d) is None
    (d / "trainer_state.pt").unlink()
    assert check_checkpoint(d, required=("config.json", ck.WEIGHTS)) is None  # an SFT export


def test_real_torch_save_is_recognised(tmp_path):
    torch = pytest.importorskip("torch")
    d = write_checkpoint(tmp_path / "c")
    torch.save({"optim": {"step": torch.tensor(3.0)}, "updates": 3}, d / "trainer_state.pt")
    assert check_checkpoint(d) is None
    data = (d / "trainer_state.pt").read_bytes()
    (d / "trainer_state.pt").write_bytes(data[: len(data) // 2])
    assert "not a complete torch.save archive" in check_checkpoint(d)


# --- listing, latest, prune ---------------------------------------------------------------
def test_list_checkpoints_orders_by_step_and_ignores_leftovers(tmp_path):
    for n in (10, 2, 1):
        write_checkpoint(_ckpts(tmp_path) / f"step_{n}")
    for junk in ("step_11.tmp5", "step_3.old7", "step_x", "latest"):
        (_ckpts(tmp_path) / junk).mkdir()
    (_ckpts(tmp_path) / "step_12").write_text("a file, not a dir")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_1", "step_2", "step_10"]
    assert list_checkpoints(tmp_path / "empty") == []


def test_latest_complete_skips_broken_ones_and_names_why(tmp_path):
    ckpts = _ckpts(tmp_path)
    write_checkpoint(ckpts / "step_1", "v1")
    write_checkpoint(ckpts / "step_2", "v2")
    (ckpts / "step_2" / "model.safetensors").write_bytes(b"")
    write_checkpoint(ckpts / "step_3", "v3")
    (ckpts / "step_3" / "trainer_state.pt").unlink()
    latest, skipped = latest_complete_checkpoint(tmp_path)
    assert latest == ckpts / "step_1"
    assert [(p.name, r) for p, r in skipped] == [
        ("step_3", "missing trainer_state.pt"), ("step_2", "model.safetensors is empty (0 bytes)")]
    assert latest_complete_checkpoint(tmp_path / "none") == (None, [])


def test_prune_keeps_the_newest_complete(tmp_path, caplog):
    ckpts = _ckpts(tmp_path)
    for n in range(1, 6):
        write_checkpoint(ckpts / f"step_{n}")
    write_checkpoint(ckpts / "step_6")
    (ckpts / "step_6" / "trainer_state.pt").unlink()  # newest, incomplete: kept, not counted
    (ckpts / "step_0").mkdir()  # oldest, incomplete: kept (a wrong verdict must not cost data)
    assert prune_checkpoints(tmp_path, keep=0) == []
    with caplog.at_level(logging.WARNING, logger="baton.runs"):
        removed = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step_1", "step_2", "step_3"]
    assert _entries(tmp_path) == ["step_0", "step_4", "step_5", "step_6"]
    assert "not pruning incomplete checkpoint" in caplog.text
    assert prune_checkpoints(tmp_path, keep=2) == []
    with pytest.raises(ValueError):
        prune_checkpoints(tmp_path, keep=-1)
