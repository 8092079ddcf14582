"""Run a recipe: the one path `baton train` (baton/cli.py) and `baton.train` (baton/python_api.py)
both take, from a recipe (a file, a mapping, or both) and dotted overrides to the driver's result.

    name, cfg = build_recipe("recipes/grpo_arithmetic.yaml", ["trainer.steps=5"])
    result = run_built(name, cfg)          # the driver's final metrics (a dict)

`build_recipe` names the algorithm (the recipe's `algorithm:`, an `algorithm=` override, or
the command's: `baton sft` checks the recipe agrees), then validates and places the config
as `load_recipe` does (placement.auto applied, its line printed). Bad input is a ConfigError
(one line) before anything is written.
"""

from __future__ import annotations

from typing import Any

from baton.config import ConfigError


def build_recipe(recipe: str | None, overrides: list[str], *, expected: str | None = None,
                 command: str = "train", data: dict[str, Any] | None = None, say: Any = None) -> tuple[str, Any]:
    """(the algorithm's name, its validated and placed config). `expected`: the algorithm
    the command runs (`baton sft` -> "sft"); a recipe that names another is refused."""
    from baton.config import merge_recipe
    from baton.trainers.algorithms import DEFAULT, config_class, load_recipe

    merged = merge_recipe(recipe, overrides, data)  # the recipe file read once; an `algorithm=` override applied
    declared = str(merged["algorithm"]) if "algorithm" in merged else None
    if expected and declared not in (None, expected):
        raise ConfigError(f"baton {command} runs algorithm {expected!r}, but the recipe says algorithm: "
                          f"{declared}; run `baton train {recipe}`")
    name = expected or declared or DEFAULT
    try:
        config_class(name)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return name, load_recipe(name, None, [], say=say, data={**merged, "algorithm": name})


def run_built(name: str, cfg: Any) -> dict[str, Any]:
    """Run the algorithm's driver on `cfg` in this process: its final metrics."""
    from baton.trainers.algorithms import driver

    return driver(name)(cfg)
