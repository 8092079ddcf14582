"""Durability helpers: fsync a file, a directory, a whole tree; write a file atomically.

A rename is atomic but not durable until the directory holding it is fsynced, and a
renamed file's data is not durable until the file itself is: after a power loss an
un-fsynced file can come back empty (ext4, xfs with delayed allocation). Everything that
publishes a file or directory by renaming it goes through here.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["YAMLFileError", "read_yaml", "atomic_write_bytes", "atomic_write_text", "fsync_dir", "fsync_file", "fsync_tree", "unused_sibling"]


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries (creations, renames, deletions inside it) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every regular file under `root`, then every directory bottom-up, `root` last.
    Symlinks are not followed."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p) and os.path.isfile(p):
                fsync_file(p)
        fsync_dir(dirpath)


def unused_sibling(path: Path, tag: str) -> Path:
    """`NAME.<tag><pid>` beside `path`, or `NAME.<tag><pid>-<n>` if that is taken (a leftover
    of an earlier process that had the same pid, common in containers where it is 1)."""
    base = f"{path.name}.{tag}{os.getpid()}"
    candidate, n = path.with_name(base), 0
    while os.path.lexists(candidate):
        n += 1
        candidate = path.with_name(f"{base}-{n}")
    return candidate


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Replace `path` with `data` so that a crash leaves the old content or the new, never
    a mix or an empty file: temp file beside it, fsync, rename, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = unused_sibling(path, "tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """`atomic_write_bytes` for text (e.g. config.yaml)."""
    return atomic_write_bytes(path, text.encode(encoding))


CONFIG_END = "# end of config\n"  # the last line of a whole run-dir config.yaml (a resume tells a torn one by it)


class YAMLFileError(ValueError):
    """A YAML file that does not parse (a typo in a recipe, a torn config.yaml): one line
    naming the file, the line and the column (the CLI exits 2)."""


def read_yaml(path: str | os.PathLike, hint: str = "") -> object:
    """The YAML document in `path` (None for an empty file); YAMLFileError, one line, if it
    does not parse (`hint`: what to do about it)."""
    import yaml

    text = Path(path).read_text()
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise YAMLFileError(f"{path}{where}: not valid YAML ({problem}){hint}") from None
