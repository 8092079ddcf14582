"""baton.runs.rundir: one run per run dir (a real second process is refused, a SIGKILLed
holder does not block), refusing / resuming / overwriting a dir that holds a run, start-up
cleanup, and removing only the Ray temp dirs of dead baton runs."""

import json
import os
import signal
import socket
import subprocess

import pytest
from runs_helpers import PYTHON, child_env, version_of, write_checkpoint

from baton.runs import ray_temp, resume_checks, rundir
from baton.runs.ray_temp import OWNER_FILE, find_stale_ray_temp_dirs, record_temp_dir_owner, remove_stale_ray_temp_dirs
from baton.runs.rundir import RunDirBusy, RunDirError, RunDirLock, prepare_run_dir

_HOLD = """
import sys, time
from baton.runs import RunDirLock
lock = RunDirLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""

_TRY = """
import sys
from baton.runs import RunDirBusy, prepare_run_dir
try:
    prepare_run_dir(sys.argv[1], resume="auto")
except RunDirBusy as e:
    print(e)
    sys.exit(3)
"""


def _hold(run_dir, seconds=60.0) -> subprocess.Popen:
    proc = subprocess.Popen([PYTHON, "-c", _HOLD, str(run_dir), str(seconds)], env=child_env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=30)
    proc.stdout.close()


# --- the lock -----------------------------------------------------------------------------
def test_second_process_is_refused_naming_the_holder(tmp_path):
    holder = _hold(tmp_path)
    try:
        other = subprocess.run([PYTHON, "-c", _TRY, str(tmp_path)], env=child_env(),
                               capture_output=True, text=True, timeout=60)
        assert other.returncode == 3, other.stderr
        assert f"in use by pid {holder.pid} on {socket.gethostname()}" in other.stdout
        assert "choose another trainer.run_dir" in other.stdout
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):  # and this process too
            RunDirLock(tmp_path).acquire()
    finally:
        _stop(holder)
    with RunDirLock(tmp_path) as lock:  # free once the holder exited
        assert lock.held and lock.holder()["pid"] == os.getpid()
    assert not lock.held


def test_sigkilled_holder_does_not_block(tmp_path):
    holder = _hold(tmp_path)
    _stop(holder, signal.SIGKILL)
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == holder.pid  # the stale file is there
    with RunDirLock(tmp_path) as lock:  # acquire() waits 0 s: a stale file that blocked would raise RunDirBusy
        assert lock.holder()["pid"] == os.getpid()


def test_wait_for_a_holder_that_finishes(tmp_path):
    holder = _hold(tmp_path, seconds=0.5)
    try:
        with RunDirLock(tmp_path).acquire(wait_s=30) as lock:
            assert lock.held
    finally:
        _stop(holder)


def test_same_process_second_lock_is_refused(tmp_path):
    with RunDirLock(tmp_path):
        with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
            RunDirLock(tmp_path).acquire()


# --- prepare_run_dir ----------------------------------------------------------------------
def _finished_run(d, steps=(5, 10)):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text("trainer:\n  steps: 10\n")
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(11)))
    for s in steps:
        write_checkpoint(d / "checkpoints" / f"step_{s}", f"v{s}")
    return d


def test_fresh_dir(tmp_path):
    with prepare_run_dir(tmp_path / "new", resume="", overwrite=False) as run:
        assert run.fresh and run.resume_from is None and run.notices == []
        assert run.lock.held and (tmp_path / "new").is_dir()
        with pytest.raises(RunDirBusy):
            prepare_run_dir(tmp_path / "new", resume="auto")
    assert not run.lock.held


@pytest.mark.parametrize("marker", ["metrics.jsonl", "checkpoints"])
def test_refuses_a_dir_that_holds_a_run(tmp_path, marker):
    (tmp_path / "config.yaml").write_text("a: 1\n")
    if marker == "checkpoints":
        write_checkpoint(tmp_path / "checkpoints" / "step_3")
    else:
        (tmp_path / marker).write_text('{"step": 0}\n{"step": 1}\n')
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(RunDirError) as err:
        prepare_run_dir(tmp_path, resume="", overwrite=False)
    msg = str(err.value)
    assert marker in msg and "trainer.resume=auto" in msg and "trainer.overwrite=true" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + [".lock"])  # nothing touched
    RunDirLock(tmp_path).acquire().release()  # the lock was released on the error


def test_refusal_describes_the_run(tmp_path):
    _finished_run(tmp_path)
    with pytest.raises(RunDirError, match=r"metrics.jsonl \(11 lines, last step 10\), config.yaml, "
                                          r"checkpoints/ \(step_5, step_10\)"):
        prepare_run_dir(tmp_path, resume="")


def test_a_run_that_never_trained_a_step_is_reused(tmp_path):
    """A run that failed at start (config.yaml, the start's step-0 line, no checkpoint) does
    not block the corrected rerun; its files are kept in previous_attempts/."""
    (tmp_path / "config.yaml").write_text("a: 1\n")
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy_greedy": 0.5}\n')
    (tmp_path / "checkpoints").mkdir()
    with prepare_run_dir(tmp_path, resume="") as run:
        assert run.fresh and "never trained a step" in run.notices[0]
    assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "metrics.jsonl").exists()
    (moved,) = (tmp_path / "previous_attempts").iterdir()
    assert (moved / "config.yaml").read_text() == "a: 1\n"


def test_resume_auto_on_a_finished_run_says_so(tmp_path):
    _finished_run(tmp_path)
    with pytest.raises(rundir.RunFinished, match=r"already finished.*step_10.*trainer.steps=10"):
        prepare_run_dir(tmp_path, resume="auto", steps=10)
    with prepare_run_dir(tmp_path, resume="auto", steps=12) as run:  # more steps: it continues
        assert run.resume_step == 10
    RunDirLock(tmp_path).acquire().release()


def test_last_step(tmp_path):
    assert rundir.last_step(tmp_path) is None
    write_checkpoint(tmp_path / "checkpoints" / "step_4")
    assert rundir.last_step(tmp_path) == 4
    (tmp_path / "metrics.jsonl").write_text('{"step": 5}\n{"step": 6, "x": 1}\n{"step": 7, "to')  # torn line
    assert rundir.last_step(tmp_path) == 6


def test_resume_with_changed_hyperparameters_is_refused_listing_them(tmp_path, monkeypatch):
    (tmp_path / "config.yaml").write_text(
        "actor:\n  lr: 0.001\n  betas: [0.9, 0.99]\ntrainer:\n  steps: 10\n  resume: ''\n  progress: true\n"
        "# end of config\n")  # whole, as save_config writes it (baton.runs.fsutil.CONFIG_END)
    same = {"actor": {"lr": 0.001, "betas": (0.9, 0.99)},
            "trainer": {"steps": 20, "resume": "auto", "progress": False},  # may change on resume
            "data": {"api_url": "http://127.0.0.1:8123", "servers": ["http://127.0.0.1:8124"]}}  # addresses
    assert resume_checks.check_resume_changes(tmp_path, same, allow=False) == []
    changed = {"actor": {"lr": 0.01, "betas": (0.9, 0.99)}, "algo": {"kl_coef": 0.1},
               "trainer": {"steps": 10, "resume": "auto", "progress": True}}
    with pytest.raises(RunDirError) as err:
        resume_checks.check_resume_changes(tmp_path, changed, allow=False)
    msg = str(err.value)
    assert "actor.lr: 0.001 -> 0.01" in msg and "algo.kl_coef: '(absent)' -> 0.1" in msg
    assert "trainer.resume_changes=allow" in msg and "\n" not in msg and "trainer.steps" not in msg
    assert resume_checks.check_resume_changes(tmp_path, changed, allow=True) == [
        "actor.lr: 0.001 -> 0.01", "algo.kl_coef: '(absent)' -> 0.1"]
    assert resume_checks.check_resume_changes(tmp_path / "none", changed, allow=False) == []  # no config.yaml
    (tmp_path / "config.yaml").write_text(f"model:\n  path: {tmp_path.name}\n")  # relative to the cwd below
    monkeypatch.chdir(tmp_path.parent)
    assert resume_checks.check_resume_changes(tmp_path, {"model": {"path": str(tmp_path)}}, allow=False) == []


def test_the_resume_hint_names_a_copied_run_dir_not_the_one_its_config_was_made_in(tmp_path, monkeypatch):
    """Following the refusal's hint must resume the dir the user named: a copied run dir's
    config.yaml still says trainer.run_dir=<the original>, and `baton train COPY/config.yaml
    trainer.resume=auto` went on training the original (a session's re-check of issue 51)."""
    monkeypatch.chdir(tmp_path)
    for run in ("orig", "copy"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "config.yaml").write_text("actor:\n  lr: 0.001\ntrainer:\n  run_dir: orig\n# end of config\n")
    changed = {"actor": {"lr": 0.01}, "trainer": {"run_dir": "ignored"}}
    hints = {}
    for run in ("orig", "copy"):
        with pytest.raises(RunDirError) as err:
            resume_checks.check_resume_changes(run, changed, allow=False)
        hints[run] = str(err.value).split("put them back: ")[1]
    assert hints["orig"].startswith("`baton train orig/config.yaml trainer.resume=auto` resumes")
    assert hints["copy"].startswith("`baton train copy/config.yaml trainer.resume=auto trainer.run_dir=copy` resumes")


def test_other_files_and_an_empty_checkpoints_dir_do_not_count(tmp_path):
    (tmp_path / "slurm-123.out").write_text("log")
    (tmp_path / "checkpoints").mkdir()
    with prepare_run_dir(tmp_path, resume="") as run:
        assert run.fresh


def test_resume_auto_takes_the_latest_complete(tmp_path):
    _finished_run(tmp_path)
    broken = write_checkpoint(tmp_path / "checkpoints" / "step_15")
    (broken / "model.safetensors").write_bytes(b"")
    with prepare_run_dir(tmp_path, resume="auto") as run:
        assert run.resume_from == tmp_path / "checkpoints" / "step_10" and run.resume_step == 10
        assert not run.fresh
        assert any("step_15" in n and "model.safetensors is empty" in n for n in run.notices)
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "config.yaml").exists()


def test_resume_auto_with_nothing_to_resume_is_a_notice(tmp_path):
    with prepare_run_dir(tmp_path / "typo", resume="auto") as run:
        assert run.fresh and run.notices == [f"nothing to resume in {tmp_path / 'typo'}: starting fresh"]


def test_resume_auto_keeps_files_of_an_attempt_without_checkpoints(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    (tmp_path / "config.yaml").write_text("a: 1\n")
    with prepare_run_dir(tmp_path, resume="auto") as run:
        assert run.fresh and "starting fresh" in run.notices[0] and "previous_attempts" in run.notices[0]
    assert not (tmp_path / "metrics.jsonl").exists()
    (moved,) = (tmp_path / "previous_attempts").iterdir()
    assert (moved / "metrics.jsonl").read_text() == '{"step": 0}\n{"step": 1}\n'
    assert (moved / "config.yaml").read_text() == "a: 1\n"
    with prepare_run_dir(tmp_path, resume="") as run:  # previous_attempts/ alone is no run
        assert run.fresh


def test_resume_auto_refuses_when_no_checkpoint_is_complete(tmp_path):
    _finished_run(tmp_path, steps=(5,))
    (tmp_path / "checkpoints" / "step_5" / "trainer_state.pt").unlink()
    with pytest.raises(RunDirError, match=r"no checkpoint .* is complete \(step_5: missing trainer_state.pt\)"):
        prepare_run_dir(tmp_path, resume="auto")
    assert (tmp_path / "metrics.jsonl").exists()  # nothing moved


def test_resume_from_a_path(tmp_path):
    run_dir = _finished_run(tmp_path / "run")
    with prepare_run_dir(run_dir, resume=str(run_dir / "checkpoints" / "step_5")) as run:
        assert run.resume_step == 5
    (run_dir / "checkpoints" / "step_5" / "config.json").unlink()
    with pytest.raises(RunDirError, match="trainer.resume=.*step_5: not a complete checkpoint: missing config.json"):
        prepare_run_dir(run_dir, resume=str(run_dir / "checkpoints" / "step_5"))
    # Another run's checkpoint into a dir holding a run: metrics would mix.
    outside = write_checkpoint(tmp_path / "elsewhere" / "step_3")
    with pytest.raises(RunDirError, match="not one of its checkpoints"):
        prepare_run_dir(run_dir, resume=str(outside))
    with prepare_run_dir(run_dir, resume=str(outside), overwrite=True) as run:
        assert run.resume_from == outside and run.resume_step == 3
    assert not (run_dir / "checkpoints").exists()
    with prepare_run_dir(tmp_path / "fresh", resume=str(outside)) as run:  # into an empty dir
        assert run.resume_from == outside


def test_overwrite_removes_only_batons_files(tmp_path):
    _finished_run(tmp_path)
    (tmp_path / "report.png").write_bytes(b"png")
    (tmp_path / "tb").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    with prepare_run_dir(tmp_path, resume="", overwrite=True) as run:
        assert run.fresh
        assert "removed" in run.notices[0] and "checkpoints/" in run.notices[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "notes.txt"]


def test_overwrite_conflicts(tmp_path):
    _finished_run(tmp_path)
    with pytest.raises(RunDirError, match="contradict"):
        prepare_run_dir(tmp_path, resume="auto", overwrite=True)
    with pytest.raises(RunDirError, match="would delete"):
        prepare_run_dir(tmp_path, resume=str(tmp_path / "checkpoints" / "step_5"), overwrite=True)
    assert len(list((tmp_path / "checkpoints").iterdir())) == 2


def test_startup_cleanup_restores_and_removes_leftovers(tmp_path):
    _finished_run(tmp_path)
    ck = tmp_path / "checkpoints"
    (ck / "step_10").rename(ck / "step_10.old4242")  # crash between the two renames
    write_checkpoint(ck / "step_10.tmp4242", "half")
    (tmp_path / "metrics.jsonl.tmp77").write_text("partial")
    (tmp_path / ".overwritten.del5").mkdir()
    (tmp_path / ".overwritten.del5" / "metrics.jsonl").write_text("old")
    with prepare_run_dir(tmp_path, resume="auto") as run:
        assert run.resume_from == ck / "step_10" and version_of(ck / "step_10") == "v10"
        text = "\n".join(run.notices)
        assert "restored" in text and "step_10.tmp4242" in text and "metrics.jsonl.tmp77" in text
        assert ".overwritten.del5" in text
    assert sorted(p.name for p in ck.iterdir()) == ["step_10", "step_5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "checkpoints", "config.yaml", "metrics.jsonl"]


# --- Ray temp dirs ------------------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([PYTHON, "-c", "pass"])
    p.wait(timeout=30)
    return p.pid


def _owned(root, name, pid=None, **override):
    d = root / name
    d.mkdir()
    (d / "session_latest").mkdir()
    (d / "session_latest" / "raylet.out").write_text("log")
    record_temp_dir_owner(d, pid)
    if override:
        info = json.loads((d / OWNER_FILE).read_text())
        info.update(override)
        (d / OWNER_FILE).write_text(json.dumps(info))
    return d


def test_record_temp_dir_owner(tmp_path):
    info = json.loads(record_temp_dir_owner(tmp_path).read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    assert info["start_ticks"] == ray_temp._start_ticks(os.getpid()) is not None


def test_only_dead_baton_ray_dirs_are_removed(tmp_path):
    dead = _owned(tmp_path, "baton-ray-dead", _dead_pid())
    alive = _owned(tmp_path, "baton-ray-alive")  # this process
    reused = _owned(tmp_path, "baton-ray-reused", start_ticks=1)  # pid now another process
    rebooted = _owned(tmp_path, "baton-ray-reboot", boot_id="not-this-boot")
    remote = _owned(tmp_path, "baton-ray-remote", _dead_pid(), host="another-host")
    unknown = tmp_path / "baton-ray-old"  # made by today's ensure_ray: no owner file
    unknown.mkdir()
    other = _owned(tmp_path, "ray-someone-else", _dead_pid())
    (tmp_path / "baton-ray-file").write_text("not a dir")
    found = dict(find_stale_ray_temp_dirs(tmp_path))
    assert set(found) == {dead, reused, rebooted}
    assert "is gone" in found[dead] and "later process" in found[reused] and "reboot" in found[rebooted]
    assert set(remove_stale_ray_temp_dirs(tmp_path)) == {dead, reused, rebooted}
    assert all(d.exists() for d in (alive, remote, unknown, other))
    assert not any(d.exists() for d in (dead, reused, rebooted))


def test_a_live_socket_keeps_the_dir(tmp_path):
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(prefix="bt-", dir="/tmp"))  # AF_UNIX paths are capped at 107 bytes
    d = _owned(tmp_path, "baton-ray-orphan", _dead_pid())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:  # an orphaned raylet, say
        srv.bind(str(d / "session_latest" / "raylet.sock"))
        srv.listen(1)
        assert find_stale_ray_temp_dirs(tmp_path) == []
    # The listener closed: its socket file stays but refuses connections.
    assert [p for p, _ in find_stale_ray_temp_dirs(tmp_path)] == [d]
