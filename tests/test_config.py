"""Typed config loading: unknown keys and wrong types name the key; overrides apply."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from baton.config import ConfigError, load_config, save_config
from baton.trainers.ppo_config import PPOConfig


@dataclass
class Inner:
    steps: int = 1
    lr: float = 0.1
    mode: Literal["a", "b"] = "a"
    names: list[str] = field(default_factory=list)


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    path: str = "x"
    weights: dict[str, float] = field(default_factory=dict)


def test_yaml_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("inner:\n  steps: 3\npath: y\n")
    cfg = load_config(Outer, recipe, ["inner.lr=1", "inner.names=[p, q]", "weights.a=2"])
    assert cfg.inner.steps == 3 and cfg.path == "y"
    assert cfg.inner.lr == 1.0 and isinstance(cfg.inner.lr, float)  # YAML int widened to float
    assert cfg.inner.names == ["p", "q"] and cfg.weights == {"a": 2.0}


def test_unknown_key_is_named_with_suggestion():
    with pytest.raises(ConfigError, match=r"unknown config key 'inner.stpes' \(did you mean 'inner.steps'\?\)"):
        load_config(Outer, overrides=["inner.stpes=5"])


@pytest.mark.parametrize("override, message", [
    ("inner.steps=abc", "config key 'inner.steps' expects int, got 'abc'"),
    ("inner.steps=1.5", "config key 'inner.steps' expects int"),
    ("inner.mode=c", "config key 'inner.mode' must be one of"),
    ("inner=3", "config key 'inner' expects a mapping"),
    ("path=[1]", "config key 'path' expects str"),
])
def test_wrong_type_is_named(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(Outer, overrides=[override])


def test_missing_recipe_and_bad_override_syntax(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Outer, tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_config(Outer, overrides=["inner.steps"])


def test_grpo_config_cross_checks_and_round_trip(tmp_path):
    with pytest.raises(ConfigError, match="mini_batch_size=24 must divide"):
        load_config(PPOConfig, overrides=["data.prompts_per_step=4", "rollout.n=8", "actor.mini_batch_size=24"])
    cfg = load_config(PPOConfig, overrides=["trainer.steps=7"])
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(PPOConfig, tmp_path / "c.yaml") == cfg


def test_shipped_recipes_load():
    """Every recipe names its algorithm and loads as that algorithm's config (the offline DPO
    recipe with a pairs file, which it leaves to the command line)."""
    from pathlib import Path

    import yaml

    from baton.trainers.algorithms import ALGORITHMS, config_class
    root = Path(__file__).parents[1]
    recipes = sorted(root.joinpath("recipes").glob("*.yaml"))
    assert len(recipes) >= 8
    seen = set()
    for r in recipes:
        name = yaml.safe_load(r.read_text())["algorithm"]
        seen.add(name)
        extra = [f"data.path={root / 'tests/fixtures/pairs.jsonl'}"] if name == "dpo" else []
        assert config_class(name) is not None and load_config(config_class(name), r, extra).algorithm == name
    assert seen == set(ALGORITHMS)
