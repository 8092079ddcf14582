"""`placement.auto` is applied where a recipe is loaded (`baton train`,
`baton.trainers.algorithms.load_recipe`): the machine's choice fills what the recipe left
unset, is printed in one line, and becomes explicit keys; on by default for the PPO family
(the suite turns the default off: BATON_PLACEMENT_AUTO=0 in tests/conftest.py); it never
changes trainer.mode; the config is validated before placement reads it; a resumed run keeps
the placement and mode of its config.yaml; a config built without it is refused rather than
silently left unplaced."""

from pathlib import Path

import pytest

import yaml

from baton.config import ConfigError, load_config, save_config
from baton.trainers.placement.auto import (choose, count_model_params, detect_machine, detect_memory,
                                             view_from_config)
from baton.trainers.algorithms import explicit_keys
from baton.trainers.algorithms import load_recipe
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[1]
RECIPE = str(REPO / "recipes/grpo_arithmetic.yaml")


def test_auto_fills_what_the_recipe_left_unset(capsys):
    cfg = load_recipe("grpo", RECIPE, ["placement=auto"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    as_given = load_recipe("grpo", RECIPE, ["placement.auto=false"])
    expected = choose(*detect_machine(), count_model_params(str(REPO / "checkpoints/arith-sft")),
                      view_from_config(as_given, set()), memory_bytes=detect_memory())  # placement=auto: nothing set
    assert line == expected.line()
    assert (cfg.placement.world_size, cfg.placement.threads_per_worker) == (expected.world_size, expected.threads_per_worker)
    assert cfg.trainer.mode == "sync" and cfg.placement.auto is False  # the recipe's mode, on every machine


def test_explicit_settings_win(capsys):
    cfg = load_recipe("grpo", RECIPE, ["placement.auto=true", "trainer.mode=sync", "placement.world_size=1"])
    assert cfg.trainer.mode == "sync" and cfg.placement.world_size == 1
    assert "overlaps" not in capsys.readouterr().out  # trainer.mode=sync as set: no generator


def test_on_by_default_for_the_ppo_family_unless_the_environment_says_0(capsys, monkeypatch):
    monkeypatch.delenv("BATON_PLACEMENT_AUTO", raising=False)
    default = load_recipe("grpo", RECIPE, [])
    asked = load_recipe("grpo", RECIPE, ["placement.auto=true"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1] and lines[0].startswith("placement auto: ")
    assert (default.placement, default.trainer.mode) == (asked.placement, asked.trainer.mode)
    off = load_recipe("grpo", RECIPE, ["placement.auto=false"])  # the recipe's own placement
    assert (off.placement.backend, off.placement.world_size, off.trainer.mode) == ("local", 1, "sync")
    assert capsys.readouterr().out == ""
    load_recipe("online_dpo", str(REPO / "recipes/online_dpo_arithmetic.yaml"), [])  # not the PPO family: as set
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("BATON_PLACEMENT_AUTO", "0")
    cfg = load_recipe("grpo", RECIPE, [])
    assert (cfg.placement.world_size, cfg.trainer.mode, capsys.readouterr().out) == (1, "sync", "")


def test_a_resumed_run_keeps_the_placement_of_its_config(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("BATON_PLACEMENT_AUTO", raising=False)
    raw = yaml.safe_load(Path(RECIPE).read_text())
    raw["model"]["path"] = str(REPO / raw["model"]["path"])
    raw.pop("placement", None)  # nothing placed by hand: auto decides every key
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = load_recipe("grpo", str(recipe), [f"trainer.run_dir={run_dir}"])
    save_config(first, run_dir / "config.yaml")
    # the saved run was placed otherwise (another machine): resuming keeps that, not a new choice
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    saved["placement"].update(backend="ray", world_size=4, threads_per_worker=3)
    saved["trainer"]["mode"] = "one_step_off"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    capsys.readouterr()
    cfg = load_recipe("grpo", str(recipe), [f"trainer.run_dir={run_dir}", "trainer.resume=auto"])
    assert (cfg.placement.backend, cfg.placement.world_size, cfg.placement.threads_per_worker,
            cfg.trainer.mode) == ("ray", 4, 3, "one_step_off")
    assert capsys.readouterr().out.startswith("placement auto: kept from the resumed run's config.yaml")
    fresh = load_recipe("grpo", str(recipe), [f"trainer.run_dir={run_dir}", "trainer.overwrite=true"])
    assert (fresh.placement, fresh.trainer.mode) == (first.placement, first.trainer.mode)


def test_a_config_built_without_it_is_refused():
    with pytest.raises(ConfigError, match="placement.auto=true is applied when the recipe is loaded"):
        load_config(PPOConfig, RECIPE, ["placement.auto=true"])
    with pytest.raises(ConfigError, match="PPO family"):
        load_recipe("online_dpo", str(REPO / "recipes/online_dpo_arithmetic.yaml"), ["placement.auto=true"])


def test_auto_never_changes_the_mode(capsys, monkeypatch):
    monkeypatch.delenv("BATON_PLACEMENT_AUTO", raising=False)
    for extra, mode in (([], "sync"), (["trainer.mode=one_step_off"], "one_step_off"),
                        (["rollout.weight_sync=checkpoint"], "sync")):
        cfg = load_recipe("grpo", RECIPE, extra)
        assert cfg.trainer.mode == mode
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3 and all(line.startswith("placement auto: ") for line in out)
    assert "trainer.mode=one_step_off (the recipe's)" in out[1] and "refused" not in " ".join(out)
    cfg = load_recipe("grpo", str(REPO / "recipes/grpo_arithmetic_api.yaml"), [])
    assert cfg.trainer.mode == "sync"


@pytest.mark.parametrize("override, message", [
    ("model.path=no/such/dir", "model.path=no/such/dir: no such directory"),
    ("data.prompts_per_step=sixteen", "config key 'data.prompts_per_step' expects int, got 'sixteen'"),
    ("trainer.stpes=3", "unknown config key 'trainer.stpes'"),
    ("reward.functions={no_such_module:fn: 1.0}", "no_such_module"),
])
def test_a_bad_config_is_one_error_before_placement_reads_it(override, message, capsys, monkeypatch):
    monkeypatch.delenv("BATON_PLACEMENT_AUTO", raising=False)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_recipe("grpo", RECIPE, [override])
    assert capsys.readouterr().out == ""  # no placement line: nothing read the bad config


def test_explicit_keys():
    assert explicit_keys({"placement": {"pools": {"a": 1}}, "trainer": {"mode": "sync"}, "algorithm": "grpo"}) == \
        {"placement.pools", "trainer.mode"}
