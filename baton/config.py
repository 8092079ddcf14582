"""Typed configs: YAML recipes mapped onto nested dataclasses, with dotted overrides.

    cfg = load_config(PPOConfig, "recipes/grpo_arithmetic.yaml", ["trainer.steps=5"])

Each component defines its own dataclass next to its code; a recipe nests them. Loading
checks every key and every value against the annotations, so `trainer.stpes=5` fails with
"unknown config key 'trainer.stpes' (did you mean 'trainer.steps'?)" and `trainer.steps=abc`
with "config key 'trainer.steps' expects int, got 'abc'". `save_config` writes the resolved
config back as YAML (the run directory keeps it).

Relative paths in a recipe file (keys named `path` or `*_path`, `save_path` excepted: what a
run reads) resolve against the recipe's directory when something exists there, else against
the working directory (`resolve_recipe_paths`); overrides on the command line resolve against
the working directory. So a recipe next to its data can be run from anywhere, and the shipped
recipes' repository-relative paths (`checkpoints/arith-sft`) still work from the root.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Union

import yaml

from baton.runs.fsutil import CONFIG_END, atomic_write_text, read_yaml


_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class ConfigError(ValueError):
    """A recipe or override that does not fit the config's schema."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against annotation `tp`, converting where YAML is loose (int -> float)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} expects a mapping ({tp.__name__}), got {value!r}")
        return _build(tp, value, key + ".")
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        if len(errors) == 1:  # `X | None`: X's own error (e.g. an unknown key inside the section)
            raise ConfigError(errors[0])
        raise ConfigError(f"config key {key!r} expects {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"config key {key!r} must be one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r} expects a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} expects a mapping, got {value!r}")
        _, val_tp = typing.get_args(tp) or (Any, Any)
        return {k: _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads "1e-3" (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key!r} expects float, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {key!r} expects int, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ConfigError(f"config key {key!r} expects {tp.__name__}, got {value!r}")
        return value
    return value


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    for k in data:
        if k not in names:
            close = difflib.get_close_matches(str(k), names, n=1) or [  # peft's r, lora_alpha: rank, alpha
                n for n in names if n.startswith(str(k)) or str(k).endswith("_" + n)][:1]
            hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {prefix + str(k)!r}{hint}; "
                              f"{cls.__name__} has {names}")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid config {prefix.rstrip('.') or cls.__name__}: {e}") from e


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like dotted.key=value")
    key, raw = text.split("=", 1)
    try:
        return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({getattr(e, 'problem', None) or e}); "
                          f"quote it") from None


def _set_dotted(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {'.'.join(path)!r}: {part!r} is not a section")
    node[path[-1]] = value


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# config class -> the step loading ends with (it returns the finished config, a copy): the
# one place it happens, so a config loaded in Python (a test, `baton.train`) is finished as
# `baton train`'s is. PPOConfig registers its generator's placement (ppo_config.py).
LOAD_STEPS: dict[type, Callable[[Any], Any]] = {}


def load_config(cls: type, path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> Any:
    """Build `cls` from a YAML file (or a dict) plus `key.sub=value` overrides, then its
    load step (`LOAD_STEPS`), if the class registered one."""
    cfg = _build(cls, merge_recipe(path, overrides, data))
    step = LOAD_STEPS.get(cls)
    return step(cfg) if step else cfg


def merge_recipe(path: str | Path | None = None, overrides: list[str] | None = None,
                 data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The recipe's mapping with `data` and the overrides applied, before any default is
    filled in (what `load_config` builds from; a key present here was set explicitly)."""
    merged: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"recipe {str(p)!r} does not exist")
        merged = read_yaml(p) or {}  # a syntax error: one line naming the line and column
        if not isinstance(merged, dict):
            raise ConfigError(f"recipe {str(p)!r} must be a mapping at the top level")
        merged = resolve_recipe_paths(merged, p.parent)
    if data:
        merged = {**merged, **data}
    for text in overrides or []:
        key, value = _parse_override(text)
        _set_dotted(merged, key, value)
    return merged


OUTPUT_PATHS = ("save_path",)  # paths a run writes: always relative to the working directory


def is_input_path_key(key: str) -> bool:
    return (key == "path" or key.endswith("_path")) and key not in OUTPUT_PATHS


def resolve_recipe_paths(data: dict[str, Any], recipe_dir: str | Path) -> dict[str, Any]:
    """`data` (a recipe's mapping) with each relative input path (`is_input_path_key`) that
    exists under `recipe_dir` replaced by that path; a path that does not exist there is left
    as written (the working directory's). Nested sections included; `data` is not changed."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            value = resolve_recipe_paths(value, recipe_dir)
        elif isinstance(value, str) and value and is_input_path_key(str(key)) and not Path(value).is_absolute():
            candidate = Path(recipe_dir) / value
            if candidate.exists():
                value = os.path.normpath(candidate)
        out[key] = value
    return out


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically (a crash never leaves half a file), ended
    by CONFIG_END."""
    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False) + CONFIG_END)
