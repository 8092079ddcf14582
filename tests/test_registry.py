"""baton.registry: one mechanism for every family of named things; lazy "module:attr" entries
are imported on first lookup only (an optional dependency is imported by the run that names it)."""

import sys

import pytest

from baton.registry import Registry, UnknownName


def test_lazy_entries_import_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "lazy_thing_mod.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("thing")
    reg.lazy("answer", "lazy_thing_mod:VALUE")
    reg.lazy("absent", "no_such_module_here:X")
    assert "lazy_thing_mod" not in sys.modules and "answer" in reg  # listed, not imported
    assert reg["answer"] == 42 and "lazy_thing_mod" in sys.modules
    with pytest.raises(ImportError):
        reg["absent"]  # noqa: B018 -- imported only when looked up
    with pytest.raises(UnknownName, match=r"unknown thing 'answr'; known: \['absent', 'answer'\]"):
        reg["answr"]  # noqa: B018
    with pytest.raises(ValueError, match="already registered"):
        reg.lazy("answer", "lazy_thing_mod:VALUE")
    monkeypatch.delitem(sys.modules, "lazy_thing_mod")


def test_every_family_is_one_registry():
    from baton.algos import ADVANTAGES
    from baton.envs import TASKS
    from baton.rollout.engines import ENGINES
    from baton.sources import SOURCES
    from baton.sync.registry import TRANSPORTS
    from baton.trainers.algorithms import ALGORITHMS

    for family in (ADVANTAGES, TASKS, ENGINES, SOURCES, TRANSPORTS, ALGORITHMS):
        assert isinstance(family, Registry), family
