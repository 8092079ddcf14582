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
    from baton.agents.envs import AGENT_ENVS
    from baton.algos import ADVANTAGES
    from baton.envs import ENVIRONMENTS, TASKS
    from baton.rollout.engines import ENGINES
    from baton.sources import SOURCES
    from baton.sync.registry import TRANSPORTS
    from baton.trainers.algorithms import ALGORITHMS

    for family in (AGENT_ENVS, ENVIRONMENTS, ADVANTAGES, TASKS, ENGINES, SOURCES, TRANSPORTS, ALGORITHMS):
        assert isinstance(family, Registry), family


def test_what_row_sources_declare_they_read_is_a_real_section_or_key():
    """`SourceSpec.reads` drives the refusal of keys the chosen source does not read: a name
    there that is no config section or key would refuse nothing."""
    from dataclasses import fields

    from baton.sources import SOURCES
    from baton.trainers.ppo_config import PPOConfig
    from baton.trainers.session.config import DataConfig

    sections = {f.name for f in fields(PPOConfig)}
    data_keys = {f"data.{f.name}" for f in fields(DataConfig)}
    for name, spec in SOURCES.items():
        for key in spec.read_keys:
            assert key in sections | data_keys, f"{name} reads {key!r}: no such section or data key"
        if spec.section:
            assert spec.section in spec.reads, f"{name} runs `{spec.section}:` but does not declare reading it"


def test_keys_read_only_by_other_sources_are_named_with_their_readers():
    from baton.sources import unread_keys

    set_keys = {"data.servers", "agent", "reward"}
    assert unread_keys("rollout", set_keys.__contains__) == [("data.servers", ["api"]), ("agent", ["agent"])]
    assert unread_keys("api", set_keys.__contains__) == [("reward", ["rollout"]), ("agent", ["agent"])]
    assert unread_keys("agent", set_keys.__contains__) == [("reward", ["rollout"]), ("data.servers", ["api"])]


def test_two_sources_answering_one_data_source_alike_are_refused_by_name(monkeypatch):
    """A second registration for `data.source: rollout` (colocated) would run or not by import
    order: choosing one says which two collide."""
    import pytest

    from baton.sources import SOURCES, SourceSpec, source_name

    monkeypatch.setitem(SOURCES, "my_rollout", SourceSpec("rollout", "my_source:build"))
    with pytest.raises(ValueError, match=r"\['rollout', 'my_rollout'\] alike"):
        source_name("rollout", generator=False)
    assert source_name("rollout", generator=True) == "generator"  # the generator form is still one
