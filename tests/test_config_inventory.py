"""No config key is accepted and ignored: an inventory of every key of every algorithm
(`tests/config_inventory.yaml`), in the shape of torchtitan's test_no_new_cli_options.py.

Each key of each algorithm's config (walked from the dataclasses, optional sections such as
`critic:` and `model.lora:` included) has an entry:

    read: baton/path/module.py      the module that reads it: the test checks that the module
                                    really accesses the attribute (a reader deleted or renamed
                                    fails here, not silently at run time)
    read: declared                  an `algo.*` key an entry of a registry declares it reads (an
                                    advantage estimator, policy loss, distillation loss, KL
                                    controller or off-policy correction: `hyper=` where it is
                                    registered, `baton.algos.config.declared_keys`), passed by
                                    name; the test checks that one does
    refused: [dotted.key=value ...] overrides (on the algorithm's recipe and its `base`
                                    overrides) under which the key
                                    is not read: loading them must be a config error naming
                                    the key (e.g. algo.gamma with an estimator that does not
                                    discount)

A key added to a config without an entry fails `test_every_key_is_in_the_inventory`, which
says where to add it; the count of keys has a budget, so growth is a decision. To list the
entries a new key could take: `python tests/test_config_inventory.py` (prints candidate
readers for keys missing from the inventory).
"""

from __future__ import annotations

import ast
import dataclasses
import sys
import types
import typing
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from baton.config import ConfigError, load_config
from baton.trainers.algorithms import ALGORITHMS, config_class

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "tests" / "config_inventory.yaml"
CHECKS = {"check", "__post_init__", "_check_algo", "_check_sources", "_check_sizes"}
DECLARED = "declared"  # the reader of the keys registry entries declare (estimators, losses, ...)
BUDGET = 700  # keys over all algorithms; raise it on purpose, not by accident


def _dataclass_of(tp) -> type | None:
    """The dataclass inside `tp` (X, X | None, Optional[X]), or None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return found[0] if found else None
    return None


def config_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of config class `cls` (nested dataclasses walked; dicts are leaves)."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        sub = _dataclass_of(hints[f.name])
        if sub is not None:
            out += config_keys(sub, f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name}")
    return out


def inventory() -> dict:
    return yaml.safe_load(INVENTORY.read_text()) or {}


@lru_cache(maxsize=None)
def attributes_read(path: str) -> frozenset[str]:
    """Attribute names accessed in module `path` (x.name), and getattr(x, "name") strings."""
    tree = ast.parse((REPO / path).read_text())
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in CHECKS]:
        fn.body = []  # a config's own range checks read every key: they are not what uses it
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {n.args[1].value for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "getattr"
              and len(n.args) > 1 and isinstance(n.args[1], ast.Constant)}
    return frozenset(names)


def declared_hyper() -> set[str]:
    """The `algo.*` keys some registry entry declares it reads (baton.algos.config.declared_keys)."""
    from baton.algos.config import declared_keys

    return {key for declared in declared_keys().values() for keys in declared.values() for key in keys}


def test_every_key_is_in_the_inventory():
    inv = inventory()
    assert set(inv) == set(ALGORITHMS), f"algorithms: {sorted(ALGORITHMS)} vs inventory {sorted(inv)}"
    problems = []
    for name in ALGORITHMS:
        keys, listed = set(config_keys(config_class(name))), set(inv[name]["keys"])
        problems += [f"{name}: {k} has no entry (add `{k}: {{read: MODULE}}` or `{{refused: [...]}}` to "
                     f"tests/config_inventory.yaml)" for k in sorted(keys - listed)]
        problems += [f"{name}: {k} is in the inventory but not in the config" for k in sorted(listed - keys)]
    assert not problems, "\n".join(problems)
    total = sum(len(v["keys"]) for v in inv.values())
    assert total <= BUDGET, f"{total} config keys over all algorithms exceed the budget of {BUDGET}"


def test_every_listed_reader_reads_its_key():
    problems = []
    for name, spec in inventory().items():
        for key, entry in spec["keys"].items():
            entry = entry or {}
            assert entry.get("read") or entry.get("refused"), f"{name}: {key} has neither read nor refused"
            reader = entry.get("read")
            if reader == DECLARED:  # passed by name to the registry entries that declare it
                if key.split(".")[-1] not in declared_hyper():
                    problems.append(f"{name}: {key} is said to be declared, but no registry entry declares it "
                                    f"(register_advantage / register_policy_loss / ...(hyper=...))")
                continue
            if reader and key.split(".")[-1] not in attributes_read(reader):
                problems.append(f"{name}: {key} is said to be read by {reader}, which never reads "
                                f"`.{key.split('.')[-1]}`")
    assert not problems, "\n".join(problems)


def _refusals():
    for name, spec in inventory().items():
        for key, entry in spec["keys"].items():
            if entry and entry.get("refused"):
                yield pytest.param(name, spec["recipe"], key, [*spec.get("base", []), *entry["refused"]],
                                   id=f"{name}:{key}")


@pytest.mark.parametrize("name,recipe,key,overrides", list(_refusals()))
def test_a_key_that_would_be_ignored_is_refused(name, recipe, key, overrides):
    with pytest.raises(ConfigError) as e:
        load_config(config_class(name), REPO / recipe, overrides)
    assert key.split(".")[-1] in str(e.value), f"the error should name {key}: {e.value}"


def _candidates(key: str) -> list[str]:  # python tests/test_config_inventory.py
    attr = key.split(".")[-1]
    return [str(p.relative_to(REPO)) for p in sorted((REPO / "baton").rglob("*.py"))
            if attr in attributes_read(str(p.relative_to(REPO)))]


if __name__ == "__main__":
    inv = inventory() if INVENTORY.exists() else {}
    for name in ALGORITHMS:
        listed = set((inv.get(name) or {}).get("keys") or {})
        for key in config_keys(config_class(name)):
            if key not in listed:
                print(f"{name}: {key}: candidates {_candidates(key)[:6]}", file=sys.stdout)
