"""Stale Ray temp dirs: the Ray backend records who made each of its temp dirs
(`record_temp_dir_owner`), and `find_stale_ray_temp_dirs` / `remove_stale_ray_temp_dirs`
remove only dirs baton created whose recorded process is gone (same host, same boot, the pid
dead or reused by a later process) and in which no Unix socket still answers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

from baton.runs.fsutil import atomic_write_text

log = logging.getLogger(__name__)

__all__ = ["OWNER_FILE", "RAY_TEMP_PREFIX", "find_stale_ray_temp_dirs", "record_temp_dir_owner",
           "remove_stale_ray_temp_dirs"]

RAY_TEMP_PREFIX = "baton-ray-"  # baton.controller.ray_backend.ensure_ray: tempfile.mkdtemp(prefix=...)
OWNER_FILE = "baton.owner"


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot; /proc/PID/stat field 22), which
    tells a live owner from a later process that got the same pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return int(text[text.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def record_temp_dir_owner(temp_dir: str | os.PathLike, pid: int | None = None) -> Path:
    """Write `TEMP_DIR/baton.owner` ({pid, host, boot_id, start_ticks, created}) so that a
    later `remove_stale_ray_temp_dirs` can tell when the process that made it is gone."""
    pid = os.getpid() if pid is None else pid
    info = {"pid": pid, "host": socket.gethostname(), "boot_id": _boot_id(),
            "start_ticks": _start_ticks(pid), "created": time.time()}
    return atomic_write_text(Path(temp_dir) / OWNER_FILE, json.dumps(info) + "\n")


def _live_socket(root: Path) -> Path | None:
    """A Unix socket under `root` that accepts a connection (a Ray process still serving)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            try:
                if not stat.S_ISSOCK(p.lstat().st_mode):
                    continue
            except OSError:
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                try:
                    s.connect(str(p))
                    return p
                except (ConnectionRefusedError, FileNotFoundError):
                    continue
                except OSError:
                    return p  # cannot tell: treat as live
    return None


def _stale_reason(d: Path) -> tuple[bool, str]:
    """(stale?, why) for one candidate dir."""
    try:
        st = d.lstat()
    except OSError as e:
        return False, str(e)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False, "not a directory of this user"
    try:
        info = json.loads((d / OWNER_FILE).read_text())
        pid = int(info["pid"])
    except FileNotFoundError:
        return False, f"no {OWNER_FILE} (made by a baton that did not record its owner; cannot tell if it is in use)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return False, f"unreadable {OWNER_FILE}: {e!r}"
    if info.get("host") != socket.gethostname():
        return False, f"owned by a process on host {info.get('host')!r}"
    boot = _boot_id()
    if info.get("boot_id") and boot and info["boot_id"] != boot:
        why = f"owner pid {pid} ran before the machine's last reboot"
    elif not _pid_alive(pid):
        why = f"owner pid {pid} is gone"
    else:
        ticks = _start_ticks(pid)
        if info.get("start_ticks") is None or ticks is None or ticks == info["start_ticks"]:
            return False, f"owner pid {pid} is alive"
        why = f"owner pid {pid} is gone (the pid now belongs to a later process)"
    if (live := _live_socket(d)) is not None:
        return False, f"{why}, but a process still serves {live}"
    return True, why


def find_stale_ray_temp_dirs(root: str | os.PathLike | None = None,
                             prefix: str = RAY_TEMP_PREFIX) -> list[tuple[Path, str]]:
    """Ray temp dirs of dead baton runs: `ROOT/<prefix>*` (ROOT: the system temp dir, where
    ensure_ray makes them), owned by this user, with a `baton.owner` naming a process on this
    host that is gone, and no Unix socket in them still answering. Returns (dir, why)."""
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    out = []
    for d in sorted(base.glob(prefix + "*")):
        stale, why = _stale_reason(d)
        if stale:
            out.append((d, why))
        else:
            log.debug("keeping %s: %s", d, why)
    return out


def remove_stale_ray_temp_dirs(root: str | os.PathLike | None = None,
                               prefix: str = RAY_TEMP_PREFIX) -> list[Path]:
    """Delete what `find_stale_ray_temp_dirs` finds (each logged with the reason); return them."""
    removed = []
    for d, why in find_stale_ray_temp_dirs(root, prefix):
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(d)
            log.info("removed stale Ray temp dir %s (%s)", d, why)
        else:
            log.warning("could not fully remove stale Ray temp dir %s (%s)", d, why)
    return removed
