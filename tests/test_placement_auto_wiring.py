"""`placement.auto: true` is applied where a recipe is loaded (`baton train`,
`baton.trainers.algorithms.load_recipe`): the machine's choice fills what the recipe left
unset, is printed in one line, and becomes explicit keys; a config built without it is
refused rather than silently left unplaced."""

from pathlib import Path

import pytest

from baton.config import ConfigError, load_config
from baton.controller.auto_placement import choose, count_model_params, detect_machine, view_from_raw
from baton.trainers.algorithms import load_recipe
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[1]
RECIPE = str(REPO / "recipes/grpo_arithmetic.yaml")


def test_auto_fills_what_the_recipe_left_unset(capsys):
    cfg = load_recipe("grpo", RECIPE, ["placement=auto"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    expected = choose(*detect_machine(), count_model_params(str(REPO / "checkpoints/arith-sft")),
                      view_from_raw({"placement": {}}))
    assert line == expected.line()
    assert (cfg.placement.world_size, cfg.placement.threads_per_worker) == (expected.world_size, expected.threads_per_worker)
    assert cfg.trainer.mode == ("one_step_off" if expected.overlap else "sync") and cfg.placement.auto is False


def test_explicit_settings_win_and_off_is_the_default(capsys):
    cfg = load_recipe("grpo", RECIPE, ["placement.auto=true", "trainer.mode=sync"])
    assert cfg.trainer.mode == "sync" and cfg.placement.world_size == 1  # the recipe's own world_size
    assert "overlaps" not in capsys.readouterr().out  # trainer.mode=sync as set: no generator
    assert load_recipe("grpo", RECIPE, []).placement.auto is False  # off unless asked this round


def test_a_config_built_without_it_is_refused():
    with pytest.raises(ConfigError, match="placement.auto=true is applied when the recipe is loaded"):
        load_config(PPOConfig, RECIPE, ["placement.auto=true"])
    with pytest.raises(ConfigError, match="PPO family"):
        load_recipe("online_dpo", str(REPO / "recipes/online_dpo_arithmetic.yaml"), ["placement.auto=true"])
