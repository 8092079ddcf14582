"""Checkpoint directories: written atomically, checked before they are trusted, pruned.

`atomic_dir(final)` is how a checkpoint is written: the caller fills a temp dir beside
`final`; on success every file is fsynced, an existing `final` is renamed aside
(`final.old<pid>`), the temp dir is renamed to `final`, the parent is fsynced, and only then
is the old copy deleted. A crash at any point leaves, after `recover_checkpoints` (run at
start-up, under the run-dir lock), either the old complete checkpoint or the new one:

    crash while writing / fsyncing tmp       -> final untouched; the tmp dir is deleted
    crash after final -> final.old, before
          tmp -> final                       -> final missing: final.old is renamed back
    crash after tmp -> final                 -> final is the new one; final.old is deleted

Checkpoints of a run live in `RUN_DIR/checkpoints/step_N`. `check_checkpoint` says why a
directory is not a loadable checkpoint (a required file missing or empty, a safetensors
file whose header does not parse or does not cover the file, a torn JSON file, a
truncated torch.save archive); `latest_complete_checkpoint` skips such directories and
names them; `prune_checkpoints` keeps the newest K complete ones.

A write that fills the disk (torch.save's C++ writer, safetensors, any OSError ENOSPC) is a
`DiskFullError`: one line naming ENOSPC, the checkpoint's path and the free space; the old
checkpoint is left as it was.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence, Union

from baton.runs.fsutil import fsync_dir, fsync_tree, unused_sibling

log = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINTS_DIR", "DEFAULT_REQUIRED", "DiskFullError", "TRAINER_STATE", "atomic_dir", "check_checkpoint",
    "checkpoint_step", "is_complete", "latest_complete_checkpoint", "list_checkpoints",
    "prune_checkpoints", "recover_checkpoints",
]

CHECKPOINTS_DIR = "checkpoints"
TRAINER_STATE = "trainer_state.pt"  # the actor's optimizer / scheduler / driver state

# One entry per requirement: a file name, or a tuple of names of which one must be present.
Requirement = Union[str, tuple[str, ...]]
# single or sharded; or a LoRA actor's adapter (PEFT format; the base is the recipe's model)
WEIGHTS: tuple[str, ...] = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
TOKENIZER_VOCAB: tuple[str, ...] = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
DEFAULT_REQUIRED: tuple[Requirement, ...] = (
    WEIGHTS, "config.json", "tokenizer_config.json", TOKENIZER_VOCAB, TRAINER_STATE,
)

_STEP = re.compile(r"step_(\d+)")
# Leftovers of interrupted writes, in a checkpoints dir:
_OURS = re.compile(r"(?P<name>.+)\.(?P<tag>tmp|old|del)\d+(-\d+)?")       # atomic_dir, prune, legacy actor
_HF = re.compile(r"\.(?P<name>.+)\.(?P<tag>tmp|old)-[A-Za-z0-9_]+")       # baton.models.load.save_pretrained


# --- writing ------------------------------------------------------------------------------
class DiskFullError(OSError):
    """A checkpoint write ran out of disk space (errno ENOSPC); one line, no C++ traceback."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return None


def _disk_full(exc: BaseException, parent: Path) -> bool:
    """Whether `exc` is a write that failed for lack of space: an OSError ENOSPC anywhere in
    its chain, or a writer's error (torch's "file write failed", safetensors' I/O error) on
    a filesystem with no space left."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, (RuntimeError, OSError)) or type(exc).__name__ == "SafetensorError":
        text = str(exc).lower()
        if any(k in text for k in ("no space", "write failed", "iostream", "unexpected pos", "i/o error", "ioerror")):
            free = _free_bytes(parent)
            return free is not None and free < 1 << 20
    return False


def _disk_full_error(final: Path, exc: BaseException) -> DiskFullError:
    free = _free_bytes(final.parent)
    where = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return DiskFullError(errno.ENOSPC, f"ENOSPC: no space left on device writing checkpoint {final} ({where}; "
                                       f"the previous checkpoint is kept): {first}")


@contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temp dir beside `final`; when the block succeeds, publish it as `final`
    (replacing an existing one) durably and atomically; when it raises, delete the temp dir
    and leave `final` as it was. See the module docstring for what a crash leaves."""
    final = Path(os.path.abspath(final))
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = unused_sibling(final, "tmp")
    os.mkdir(tmp)  # umask permissions, unlike mkdtemp's 0700: others may read checkpoints
    try:
        yield tmp
        fsync_tree(tmp)
    except BaseException as exc:
        full = not isinstance(exc, DiskFullError) and _disk_full(exc, parent)  # before the space is freed
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise _disk_full_error(final, exc) from None
        raise
    old = None
    try:
        if os.path.lexists(final):
            old = unused_sibling(final, "old")
            os.replace(final, old)
        os.replace(tmp, final)
    except BaseException:
        if old is not None and not os.path.lexists(final):
            os.replace(old, final)  # put the previous checkpoint back
            old = None
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(parent)  # the new entry is durable before the old copy goes
    if old is not None:
        try:
            shutil.rmtree(old)
        except OSError as e:  # committed already; recover_checkpoints deletes it next start
            log.warning("could not delete the previous checkpoint %s: %s", old, e)


# --- reading ------------------------------------------------------------------------------
def checkpoint_step(path: str | os.PathLike) -> int | None:
    """N for a directory named `step_N`, else None."""
    m = _STEP.fullmatch(Path(path).name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoints/step_N` directories of a run, oldest (lowest N) first; temp and
    aside copies of interrupted saves are not listed. Completeness is not checked."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir()
             if (step := checkpoint_step(p)) is not None and p.is_dir() and not p.is_symlink()]
    return [p for _, p in sorted(found)]


def _check_safetensors(path: Path) -> str | None:
    from safetensors import safe_open  # checks the header and that the data covers the file

    try:
        with safe_open(str(path), framework="numpy") as f:
            f.keys()
    except Exception as e:  # SafetensorError, OSError
        return f"{path.name}: unreadable safetensors ({e})"
    return None


def _check_file(path: Path) -> str | None:
    """Why a present required file is unusable (empty, torn JSON, truncated archive)."""
    try:
        size = path.stat().st_size
    except OSError as e:
        return f"{path.name}: {e}"
    if size == 0:
        return f"{path.name} is empty (0 bytes)"
    if path.suffix == ".json":
        try:
            json.loads(path.read_bytes())
        except (ValueError, OSError) as e:
            return f"{path.name}: not valid JSON ({e})"
    elif path.suffix in (".pt", ".pth") and not zipfile.is_zipfile(path):
        return f"{path.name}: not a complete torch.save archive (truncated?)"
    return None


def check_checkpoint(ckpt_dir: str | os.PathLike, required: Sequence[Requirement] = DEFAULT_REQUIRED) -> str | None:
    """None if `ckpt_dir` is a loadable checkpoint, else the first reason it is not.

    `required`: file names (or tuples of alternatives, one of which must be present) that
    must exist and be non-empty; `.json` ones must parse, `.pt` ones must be whole zip
    archives (torch.save's format). Besides, every `*.safetensors` file must open with
    `safetensors.safe_open`, and a `*.safetensors.index.json` must name only shards present."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return "not a directory" if d.exists() else "does not exist"
    for req in required:
        names = (req,) if isinstance(req, str) else tuple(req)
        present = [d / n for n in names if (d / n).is_file()]
        if not present:
            return f"missing {names[0]}" if len(names) == 1 else f"missing all of {', '.join(names)}"
        reasons = [r for p in present if (r := _check_file(p))]
        if len(reasons) == len(present):
            return reasons[0]
    for p in sorted(d.glob("*.safetensors")):
        if (r := _check_safetensors(p)) is not None:
            return r
    for index in sorted(d.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_bytes())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
            return f"{index.name}: not a valid safetensors index ({e!r})"
        missing = sorted(s for s in shards if not (d / s).is_file())
        if missing:
            return f"{index.name} lists missing shard(s): {', '.join(missing)}"
    return None


def is_complete(ckpt_dir: str | os.PathLike, required: Sequence[Requirement] = DEFAULT_REQUIRED) -> bool:
    """True if `check_checkpoint` finds nothing wrong."""
    return check_checkpoint(ckpt_dir, required) is None


def latest_complete_checkpoint(
    run_dir: str | os.PathLike, required: Sequence[Requirement] = DEFAULT_REQUIRED,
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete `checkpoints/step_N` of a run (None if there is none), and the
    newer ones skipped on the way, each with the reason."""
    skipped: list[tuple[Path, str]] = []
    for ckpt in reversed(list_checkpoints(run_dir)):
        reason = check_checkpoint(ckpt, required)
        if reason is None:
            return ckpt, skipped
        skipped.append((ckpt, reason))
    return None, skipped


# --- housekeeping -------------------------------------------------------------------------
def _remove_dir(path: Path) -> None:
    """Delete a directory so that a crash midway leaves no half-deleted `step_N`: rename
    it to `NAME.del<pid>` (which recover_checkpoints deletes) first."""
    trash = unused_sibling(path, "del")
    os.replace(path, trash)
    shutil.rmtree(trash)


def prune_checkpoints(run_dir: str | os.PathLike, keep: int,
                      required: Sequence[Requirement] = DEFAULT_REQUIRED) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (keep=0: keep all); return the
    deleted ones. Incomplete checkpoints are never deleted here (they are not counted
    either): a wrong verdict must not cost data; they are logged."""
    if keep < 0:
        raise ValueError(f"keep must be >= 0 (0 keeps all), got {keep}")
    if keep == 0:
        return []
    complete = []
    for ckpt in list_checkpoints(run_dir):
        reason = check_checkpoint(ckpt, required)
        if reason is None:
            complete.append(ckpt)
        else:
            log.warning("not pruning incomplete checkpoint %s (%s)", ckpt, reason)
    doomed = complete[:-keep]
    for ckpt in doomed:
        _remove_dir(ckpt)
        log.info("pruned checkpoint %s", ckpt)
    if doomed:
        fsync_dir(Path(run_dir) / CHECKPOINTS_DIR)
    return doomed


def recover_checkpoints(run_dir: str | os.PathLike) -> list[str]:
    """Finish what interrupted saves and prunes left in `RUN_DIR/checkpoints`; return one
    line per action. Call it at start-up while holding the run-dir lock (a live writer's
    temp dir would look the same).

    * `NAME.old<pid>` (and save_pretrained's `.NAME.old-*/ckpt`): the previous `NAME`,
      moved aside just before the new one was renamed in. If `NAME` is missing the crash
      came between the two renames: it is renamed back. Otherwise it is deleted.
    * `NAME.tmp<pid>` / `.NAME.tmp-*`: a save that never committed: deleted.
    * `NAME.del<pid>`: a pruned checkpoint whose deletion was cut short: deleted."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    actions: list[str] = []
    olds, doomed = [], []
    for p in sorted(root.iterdir()):
        if m := _OURS.fullmatch(p.name):
            name, tag, content = m["name"], m["tag"], p
        elif m := _HF.fullmatch(p.name):
            name, tag, content = m["name"], m["tag"], p / "ckpt"
        else:
            continue
        if tag == "old":
            olds.append((name, p, content))
        else:
            doomed.append((p, "unfinished save" if tag == "tmp" else "interrupted prune"))
    # Newest first, so that if several were left for one name the newest is restored.
    olds.sort(key=lambda t: t[1].stat().st_mtime, reverse=True)
    for name, p, content in olds:
        final = root / name
        if not os.path.lexists(final) and content.is_dir():
            os.replace(content, final)
            actions.append(f"restored {final} from {p.name} (a save was interrupted between its renames)")
            if content != p:
                doomed.append((p, "empty after restore"))
        else:
            doomed.append((p, "previous copy of a completed save"))
    for p, why in doomed:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        actions.append(f"removed {p} ({why})")
    if actions:
        fsync_dir(root)
        for a in actions:
            log.info("%s", a)
    return actions
