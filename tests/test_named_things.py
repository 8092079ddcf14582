"""Named things stay true: every backticked `baton.*` name in the docs (README.md, docs/) and in
the package's docstrings and comments resolves to a module or an attribute that exists."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"`(baton(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")  # `baton.x.y` (a call's parentheses may follow)
NOT_PYTHON = {"baton.owner": "the Ray temp dir's owner file", "baton.serve": "a logger name"}


def resolves(dotted: str) -> bool:
    """Whether `dotted` is a module, or a module's attribute path (baton.a.b.C.method)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("baton"):  # the module is there; an extra it imports is not
                return importlib.util.find_spec(".".join(parts[:cut])) is not None
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def named(paths: list[Path]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in paths:
        for name in NAME.findall(path.read_text(encoding="utf-8")):
            out.setdefault(name, []).append(str(path.relative_to(REPO)))
    return out


def test_every_backticked_baton_name_resolves():
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "baton").rglob("*.py"))]
    broken = {name: where for name, where in named(paths).items() if name not in NOT_PYTHON and not resolves(name)}
    assert not broken, f"names that do not resolve (name: where): {broken}"


def test_the_check_catches_a_stale_name():
    assert resolves("baton.trainers.ppo.train") and resolves("baton.algos")
    assert not resolves("baton.algos.correction") and not resolves("baton.trainers.ppo.no_such_function")
