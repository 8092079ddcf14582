"""The run directory: one run at a time in it, and no run silently destroying another's.

* `RunDirLock` - an exclusive `fcntl.flock` on `RUN_DIR/.lock`, which holds the owner's
  pid, host, start time and command line for the error a second run gets. The kernel drops
  the lock when its process dies (kill -9 included), so a leftover `.lock` file never
  blocks; the file itself is never deleted (deleting a lock file races with a process
  that has just opened it).
* `prepare_run_dir(path, resume=..., overwrite=...)` - take the lock, finish what a crash
  left (`cleanup_interrupted`), and decide how the run starts: refuse a dir that already
  holds a run unless `trainer.resume` or `trainer.overwrite` says what to do with it;
  resolve what to resume from. Returns a `PreparedRun` that keeps the lock: hold it (a
  `with` block, or a reference until the run ends).
* Stale Ray temp dirs are `baton.runs.ray_temp`'s.

`resume="auto"` with nothing to resume starts fresh with a notice, not an error: auto is
what a preemptible job passes on every start, its first start included, and a job that
restarts before its first checkpoint must start over rather than fail forever. The typo
risk is covered by the notice (printed first thing), by the refusal of a dir holding
checkpoints none of which is loadable, and by files of an attempt that saved no checkpoint
being moved to `previous_attempts/`, not deleted.

A dir whose run never trained a step (config.yaml, metrics lines of step 0 at most, no
checkpoint: a run that failed at start) is reused by the next fresh run without
`trainer.overwrite` (its files move to `previous_attempts/`). `resume="auto"` on a run whose
newest checkpoint is already at `trainer.steps` raises `RunFinished` (the CLI prints one line
and exits 0: nothing to do is not a failure for a job that passes auto on every start).
What a resumed run may change (its config, its data files) is checked by
`baton.runs.resume_checks`. `last_step` is the step a run dir reached (for the Ctrl-C line).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from baton.runs.checkpoints import (
    CHECKPOINTS_DIR, DEFAULT_REQUIRED, Requirement, check_checkpoint, checkpoint_step,
    latest_complete_checkpoint, list_checkpoints, recover_checkpoints,
)
from baton.runs.fsutil import fsync_dir, unused_sibling
from baton.runs.metrics_log import METRICS_FILE

log = logging.getLogger(__name__)

__all__ = [
    "ARTIFACTS", "LOCK_FILE", "MARKERS", "PreparedRun", "RunDirBusy", "RunDirError",
    "RunDirLock", "RunDirTaken", "RunFinished", "cleanup_interrupted", "last_step", "prepare_run_dir",
]

LOCK_FILE = ".lock"
CONFIG_FILE = "config.yaml"
PREVIOUS = "previous_attempts"
# A run dir "holds a run" if it has one of these:
MARKERS = (METRICS_FILE, CONFIG_FILE, CHECKPOINTS_DIR)
# What baton writes into a run dir: what overwrite removes. Anything else is left alone.
DATA_FILES = "data_files.json"  # the size and sha256 of each data file the run reads (check_data_unchanged)
ARTIFACTS = (METRICS_FILE, CONFIG_FILE, CHECKPOINTS_DIR, DATA_FILES, "report.png", "tb", "wandb", PREVIOUS)
TORN_CONFIG = " (a torn write? it is the resumed run's config: restore it, or start over with trainer.overwrite=true)"
_TRASH = re.compile(r"\.overwritten\.del\d+(-\d+)?")                            # overwrite, cut short
_TMP_FILE = re.compile(rf"({re.escape(METRICS_FILE)}|{re.escape(CONFIG_FILE)})\.tmp\d+(-\d+)?")


class RunDirError(RuntimeError):
    """The run dir cannot be used as asked; the message says why and what to set."""


class RunDirTaken(RunDirError):
    """The run dir holds another run and the config says neither to resume it nor to
    discard it: bad input (the CLI's exit 2), refused before anything of the run is written."""


class RunDirBusy(RunDirError):
    """Another process holds the run dir's lock."""


class RunFinished(RunDirError):
    """resume=auto on a run that already reached its trainer.steps: nothing to do."""


# --- the lock -----------------------------------------------------------------------------
def _describe_holder(info: dict[str, Any] | None) -> str:
    if not info:
        return "another process (its details are not readable yet)"
    text = f"pid {info.get('pid', '?')} on {info.get('host', '?')}"
    if info.get("started"):
        text += f", started {info['started']}"
    if info.get("argv"):
        text += f" ({' '.join(map(str, info['argv']))[:200]})"
    return text


class RunDirLock:
    """Exclusive lock on a run dir: `flock(RUN_DIR/.lock)`. Released by `release()`, by
    leaving the `with` block, or by the kernel when the process dies. Not inherited by
    programs the holder execs (close-on-exec); a forked child shares it."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> dict[str, Any] | None:
        """What the lock file says about its (last) holder, or None."""
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def acquire(self, wait_s: float = 0.0) -> "RunDirLock":
        """Take the lock, retrying for up to `wait_s` seconds; RunDirBusy naming the holder
        if another process has it."""
        if self._fd is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + wait_s
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise RunDirError(
                            f"cannot lock {self.path}: {e}. The filesystem does not support flock "
                            f"(a Lustre/NFS mount without lock support?); use a run dir on one that does"
                        ) from e
                    if time.monotonic() >= deadline:
                        raise RunDirBusy(
                            f"run dir {self.run_dir} is in use by {_describe_holder(self.holder())}. "
                            "Two runs in one run dir would interleave their metrics and overwrite each "
                            "other's checkpoints: wait for it to finish, stop it, or choose another "
                            "trainer.run_dir.") from None
                    time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            info = {"pid": os.getpid(), "host": socket.gethostname(),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "started_unix": time.time(),
                    "argv": sys.argv}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # the file stays (see the module docstring); its content goes
        finally:
            os.close(fd)  # closing the last descriptor releases the flock

    close = release

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:  # dropping the last reference releases the lock
        if self._fd is not None:
            try:
                os.close(self._fd)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


# --- start-up cleanup ---------------------------------------------------------------------
def cleanup_interrupted(run_dir: str | os.PathLike) -> list[str]:
    """Finish what crashed runs left in a run dir; return one line per action (also logged).
    Checkpoints: see `recover_checkpoints` (an interrupted save's `.old` copy is restored if
    the checkpoint is missing; temp dirs deleted). Also removes temp files of atomic writes
    of metrics.jsonl / config.yaml and the trash of an interrupted overwrite. Call it only
    while holding the run dir's lock."""
    d = Path(run_dir)
    actions = recover_checkpoints(d)
    if not d.is_dir():
        return actions
    removed = []
    for p in sorted(d.iterdir()):
        if _TMP_FILE.fullmatch(p.name) and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(f"removed {p} (temp file of an interrupted write)")
        elif _TRASH.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(f"removed {p} (contents of an interrupted overwrite)")
    for a in removed:
        log.info("%s", a)
    return actions + removed


# --- prepare ------------------------------------------------------------------------------
@dataclass
class PreparedRun:
    """A run dir ready for a run, locked until `close()` / the end of the `with` block.

    resume_from: the checkpoint to load (None: start fresh); resume_step: its N if it is
    named `step_N`. notices: lines to show the user (nothing to resume, skipped checkpoints,
    what overwrite removed, what start-up cleanup did)."""

    path: Path
    lock: RunDirLock
    resume_from: Path | None = None
    resume_step: int | None = None
    notices: list[str] = field(default_factory=list)

    @property
    def fresh(self) -> bool:
        return self.resume_from is None

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> "PreparedRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _describe_contents(d: Path) -> str:
    parts = []
    m = d / METRICS_FILE
    if m.exists():
        lines = [ln for ln in m.read_bytes().splitlines() if ln.strip()]
        last = None
        for ln in reversed(lines[-2:]):
            try:
                last = json.loads(ln).get("step")
                break
            except (ValueError, AttributeError):
                continue
        parts.append(f"{METRICS_FILE} ({len(lines)} lines" + (f", last step {last})" if last is not None else ")"))
    if (d / CONFIG_FILE).exists():
        parts.append(CONFIG_FILE)
    if (d / CHECKPOINTS_DIR).exists():
        names = [p.name for p in list_checkpoints(d)]
        shown = ", ".join(names[-4:]) if names else "no step_N"
        parts.append(f"{CHECKPOINTS_DIR}/ ({'..., ' if len(names) > 4 else ''}{shown})")
    return ", ".join(parts)


def _holds_run(d: Path) -> bool:
    for name in MARKERS:
        p = d / name
        if name == CHECKPOINTS_DIR:
            if p.is_dir() and any(p.iterdir()):
                return True
        elif os.path.lexists(p):
            return True
    return False


def _metric_steps(d: Path) -> list[int]:
    """The steps of metrics.jsonl's lines (unreadable lines skipped: this only describes)."""
    steps = []
    try:
        raw = (d / METRICS_FILE).read_bytes()
    except OSError:
        return steps
    for ln in raw.splitlines():
        try:
            steps.append(int(json.loads(ln)["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return steps


def _never_trained(d: Path) -> bool:
    """The dir's run failed before training a step: no checkpoint (an empty checkpoints/
    aside), no metrics line beyond step 0 (the start's evaluation)."""
    ck = d / CHECKPOINTS_DIR
    if ck.is_dir() and any(ck.iterdir()):
        return False
    if os.path.lexists(ck) and not ck.is_dir():
        return False
    return all(s <= 0 for s in _metric_steps(d))


def last_step(run_dir: str | os.PathLike) -> int | None:
    """The last step a run dir shows: its newest metrics line, else its newest checkpoint."""
    d = Path(run_dir)
    steps = _metric_steps(d) + [s for s in map(checkpoint_step, list_checkpoints(d)) if s is not None]
    return max(steps) if steps else None


def _remove_artifacts(d: Path) -> list[str]:
    """Remove what baton wrote into `d` (ARTIFACTS), leaving anything else. First every
    artifact is renamed into one trash dir (the run dir then looks fresh at once; a crash
    leaves the trash for cleanup_interrupted), then the trash is deleted."""
    present = [d / n for n in ARTIFACTS if os.path.lexists(d / n)]
    if not present:
        return []
    names = [p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in present]
    trash = unused_sibling(d / ".overwritten", "del")
    os.mkdir(trash)
    for p in present:
        os.replace(p, trash / p.name)
    fsync_dir(d)
    shutil.rmtree(trash, ignore_errors=True)
    return names


def _move_to_previous(d: Path) -> Path | None:
    """Move the artifacts of an attempt that saved no checkpoint to previous_attempts/<time>/."""
    present = [d / n for n in ARTIFACTS if n != PREVIOUS and os.path.lexists(d / n)]
    if not present:
        return None
    dest = unused_sibling(d / PREVIOUS / time.strftime("%Y%m%d-%H%M%S"), "pid")
    dest.mkdir(parents=True)
    for p in present:
        os.replace(p, dest / p.name)
    fsync_dir(d)
    return dest


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def prepare_run_dir(path: str | os.PathLike, *, resume: str | None = "", overwrite: bool = False,
                    required: Sequence[Requirement] = DEFAULT_REQUIRED, wait_s: float = 0.0,
                    steps: int | None = None) -> PreparedRun:
    """Lock the run dir `path` (creating it), clean up after crashed runs, and decide how the
    run starts:

    * resume="" (fresh): a dir that holds a run (metrics.jsonl, config.yaml or a non-empty
      checkpoints/) is refused with RunDirError naming its contents and both switches,
      unless that run never trained a step (its files move to previous_attempts/).
    * resume="auto": the newest complete `checkpoints/step_N` (newer incomplete ones are
      skipped, with a notice each). Checkpoints present but none complete: RunDirError. No
      checkpoints at all: a notice "nothing to resume in DIR: starting fresh", and files of
      the attempt that saved none move to previous_attempts/<time>/.
    * resume=PATH: that checkpoint, which must be complete (RunDirError with the reason
      otherwise). A checkpoint outside this run dir into a dir that holds another run needs
      overwrite.
    * steps: the run's trainer.steps; resume="auto" from a checkpoint at or past it raises
      RunFinished.
    * overwrite=True: baton's files in the dir (ARTIFACTS) are removed (others are left);
      cannot be combined with resume="auto" or a checkpoint inside this dir.

    The returned PreparedRun holds the lock; on an error the lock is released."""
    d = Path(path)
    resume = (resume or "").strip()
    lock = RunDirLock(d).acquire(wait_s)
    try:
        run = PreparedRun(path=d, lock=lock)
        run.notices += cleanup_interrupted(d)
        ckpt_path = Path(resume) if resume not in ("", "auto") else None
        if overwrite and resume == "auto":
            raise RunDirError("trainer.overwrite=true and trainer.resume=auto contradict each other: "
                              "set only one (overwrite discards the run that auto would resume)")
        if overwrite and ckpt_path is not None and _inside(ckpt_path, d):
            raise RunDirError(f"trainer.overwrite=true would delete {ckpt_path}, the checkpoint "
                              f"trainer.resume names; copy it out of {d} first, or drop one switch")
        if overwrite:
            removed = _remove_artifacts(d)
            if removed:
                run.notices.append(f"trainer.overwrite=true: removed {', '.join(removed)} from {d}")
        elif _holds_run(d) and resume == "" and _never_trained(d):
            moved = _move_to_previous(d)
            run.notices.append(f"{d} held a run that never trained a step: reusing it (its files moved to {moved})")
        elif _holds_run(d) and resume == "":
            raise RunDirTaken(
                f"run dir {d} already holds a run: {_describe_contents(d)}. To continue it set "
                f"trainer.resume=auto; to discard it and start over set trainer.overwrite=true; or "
                f"choose another trainer.run_dir.")

        if resume == "auto":
            ckpt, skipped = latest_complete_checkpoint(d, required)
            for p, reason in skipped:
                run.notices.append(f"skipping incomplete checkpoint {p}: {reason}")
            if ckpt is not None:
                run.resume_from, run.resume_step = ckpt, checkpoint_step(ckpt)
                if steps is not None and run.resume_step is not None and run.resume_step >= steps:
                    raise RunFinished(
                        f"the run in {d} already finished: its checkpoint {ckpt.name} is at trainer.steps="
                        f"{steps}; nothing to do (raise trainer.steps to train further, or set "
                        f"trainer.overwrite=true to start over)")
            elif skipped:
                raise RunDirError(
                    f"trainer.resume=auto: no checkpoint in {d / CHECKPOINTS_DIR} is complete ("
                    + "; ".join(f"{p.name}: {r}" for p, r in skipped)
                    + "). Set trainer.resume=PATH to a checkpoint to load anyway, or "
                      "trainer.overwrite=true to discard them and start over.")
            else:
                moved = _move_to_previous(d)
                note = f"nothing to resume in {d}: starting fresh"
                if moved is not None:
                    note += f" (files of an earlier attempt that saved no checkpoint moved to {moved})"
                run.notices.append(note)
        elif ckpt_path is not None:
            reason = check_checkpoint(ckpt_path, required)
            if reason is not None:
                raise RunDirError(f"trainer.resume={resume}: not a complete checkpoint: {reason}")
            if not overwrite and _holds_run(d) and not _inside(ckpt_path, d / CHECKPOINTS_DIR):
                raise RunDirTaken(
                    f"run dir {d} holds another run ({_describe_contents(d)}) and trainer.resume="
                    f"{resume} is not one of its checkpoints: the two runs' metrics would mix. Set "
                    f"trainer.overwrite=true to discard it, or choose another trainer.run_dir.")
            run.resume_from, run.resume_step = ckpt_path, checkpoint_step(ckpt_path)
        if run.resume_from is not None:  # which checkpoint a resumed run continues from, said first thing
            run.notices.append(f"resuming {d} from checkpoint {Path(run.resume_from).name}"
                               + (f" (step {run.resume_step} of {steps})" if run.resume_step is not None and steps
                                  else ""))
        for note in run.notices:
            log.info("%s", note)
        return run
    except BaseException:
        lock.release()
        raise
