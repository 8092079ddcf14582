"""User modules: a recipe's `module:function` reward, `module:Class` task or environment,
importable the same way in every process of a run.

`add_user_path(dir)` (the `baton` command calls it with the working directory) puts `dir` on
`sys.path` of this process and on `PYTHONPATH` / `BATON_USER_PATH` of its environment, which
every child inherits: reward worker processes, a local Ray instance's workers (started by
the driver after this), `baton launch`'s services. `ray_runtime_env()` is the same for a Ray
cluster started elsewhere (`ray.init(runtime_env=...)`). `load_object("pkg.mod:attr")`
imports a module by name (after putting `BATON_USER_PATH`'s dirs on `sys.path`, for a
process started with the variable but not the path) and returns the attribute, with a
one-line error naming what is missing.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

USER_PATH_ENV = "BATON_USER_PATH"


def _prepend(var: str, path: str) -> None:
    parts = [p for p in os.environ.get(var, "").split(os.pathsep) if p]
    if path not in parts:
        os.environ[var] = os.pathsep.join([path, *parts])


def add_user_path(path: str | os.PathLike | None = None) -> str:
    """Make modules in `path` (default: the working directory) importable here and in every
    process started from here on. Returns the absolute path."""
    p = os.path.abspath(os.fspath(path) if path is not None else os.getcwd())
    if p not in sys.path:
        sys.path.insert(0, p)
    _prepend("PYTHONPATH", p)
    _prepend(USER_PATH_ENV, p)
    return p


def _apply_env_path() -> None:
    for p in os.environ.get(USER_PATH_ENV, "").split(os.pathsep):
        if p and p not in sys.path:
            sys.path.insert(0, p)


def ray_runtime_env() -> dict[str, Any]:
    """`runtime_env` for `ray.init` so that workers of a cluster started elsewhere import the
    same user modules ({} when none were added)."""
    paths = os.environ.get(USER_PATH_ENV, "")
    if not paths:
        return {}
    return {"env_vars": {USER_PATH_ENV: paths, "PYTHONPATH": os.environ.get("PYTHONPATH", paths)}}


def is_spec(name: str) -> bool:
    """`pkg.mod:attr` (a user object by import path), not a registry name."""
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr) and "/" not in module


def own_error(e: BaseException) -> str:
    """The module's own error in one line, with where it was raised (its file and line)."""
    import traceback

    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} ({e.filename}:{e.lineno})"
    frames = traceback.extract_tb(e.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename] or frames
    where = f" ({user[-1].filename}:{user[-1].lineno})" if user else ""
    text = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {text}{where}" if text else f"{type(e).__name__}{where}"


def load_object(spec: str, what: str = "object") -> Any:
    """The attribute `attr` of module `pkg.mod` for `spec` = "pkg.mod:attr"."""
    module, _, attr = spec.partition(":")
    _apply_env_path()
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise ValueError(f"{what} {spec!r}: no module {module!r} (looked in the working directory "
                             f"{os.getcwd()} and sys.path)") from None
        raise ValueError(f"{what} {spec!r}: importing {module!r} failed: {own_error(e)}") from None
    except Exception as e:  # noqa: BLE001 - a syntax error, or the module's own code raising at import
        raise ValueError(f"{what} {spec!r}: importing {module!r} failed: {own_error(e)}") from None
    obj = mod
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"{what} {spec!r}: module {module!r} has no {attr!r}")
    return obj


class MissingExtra(ValueError):
    """An optional package a run chose is not installed: one line naming the pip command
    (a ValueError, so a config check turns it into `baton: config error: ...`, exit 2)."""


def require_extra(module: str, extra: str, who: str) -> Any:
    """The optional package `module` (imported now, by the run that chose it), or
    MissingExtra: "{who} needs the {extra} extra: pip install -e '.[{extra}]'"."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise MissingExtra(f"{who} needs the {extra!r} extra ({module.split('.')[0]} is not installed): "
                               f"pip install -e '.[{extra}]'") from None
        raise
