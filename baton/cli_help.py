"""What the `baton` command says about configs: every key with its one-line help
(`baton train --help`), the config class of a recipe (`baton config`), and the run dir a
command line points at (the Ctrl-C line).

A key's help is the comment after its field in the config dataclass's source
(`steps: int = 100  # ...`), so the help cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from typing import Any

# Which algorithm's keys `baton COMMAND --help` lists (train: the default; a recipe's own
# `algorithm:` picks its class, see `baton config`).
COMMAND_ALGORITHMS = {"train": "grpo", "sft": "sft", "rm": "rm", "online-dpo": "online_dpo", "dpo": "dpo"}


def config_class(algorithm: str) -> type:
    """The config dataclass of `algorithm` (baton.trainers.algorithms; ConfigError, one line,
    for an unknown name)."""
    from baton.config import ConfigError
    from baton.trainers.algorithms import config_class as registered

    try:
        return registered(algorithm)
    except ValueError as e:
        raise ConfigError(str(e)) from None


_FIELD_COMMENT = re.compile(r"^\s+(\w+)\s*:[^#]*#\s*(.+?)\s*$")


def _comments(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's comment wins
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for line in source.splitlines():
            m = _FIELD_COMMENT.match(line)
            if m:
                out[m.group(1)] = m.group(2)
    return out


def _section_type(tp: Any) -> type | None:
    """The dataclass of a section field (`LoraAdapterConfig | None` too), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return "(required)"


def keys_help(cls: type, prefix: str = "") -> list[str]:
    """One line per key of config dataclass `cls`: `section.key = default  help`; a section
    is a header line (`section:  help`) followed by its keys."""
    hints, notes, lines = typing.get_type_hints(cls), _comments(cls), []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key, note = prefix + f.name, notes.get(f.name, "")
        section = _section_type(hints[f.name])
        if section is not None:
            lines.append(f"{key}:" + (f"  {note}" if note else ""))
            lines += keys_help(section, key + ".")
            continue
        default = _default(f)
        shown = default if isinstance(default, str) and default else repr(default)
        text = f"  {key} = {shown}"
        lines.append(f"{text:<48s} {note}".rstrip())
    return lines


def command_keys_help(command: str) -> str:
    """The key listing `baton COMMAND --help` ends with."""
    algorithm = COMMAND_ALGORITHMS.get(command, "grpo")
    cls = config_class(algorithm)
    head = (f"config keys of `baton {command}` ({cls.__name__}; set in the recipe or as dotted.key=value; "
            f"`baton config RECIPE` prints a recipe's resolved values):")
    text = "\n".join([head, *keys_help(cls)])
    if command == "train":
        from baton.trainers.algorithms import ALGORITHMS

        others = [n for n in ALGORITHMS if config_class(n) is not cls]
        text += (f"\n\nthese are the keys of algorithm {algorithm} (and of those sharing {cls.__name__}); a recipe's "
                 f"`algorithm:` may name {', '.join(others)} too: `baton config RECIPE` prints its keys, "
                 f"`baton sft --help` (rm, online-dpo, dpo) lists them")
    return text


def run_dir_of(argv: list[str]) -> str | None:
    """The trainer.run_dir a `baton COMMAND RECIPE [overrides]` command line writes to (the
    override, else the recipe's), or None if it does not say."""
    import yaml

    if len(argv) < 2 or argv[0] not in COMMAND_ALGORITHMS:
        return None
    for text in reversed(argv[2:]):
        key, sep, value = text.partition("=")
        if sep and key.strip() == "trainer.run_dir":
            return value.strip()
    try:
        with open(argv[1]) as f:
            recipe = yaml.safe_load(f) or {}
        run_dir = (recipe.get("trainer") or {}).get("run_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return str(run_dir) if run_dir else None
