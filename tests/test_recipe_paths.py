"""Relative paths in a recipe file resolve against the recipe's directory when they exist
there, else against the working directory (docs/OWN_DATA.md, "Paths")."""

import os

from baton.config import load_config, merge_recipe, resolve_recipe_paths
from baton.trainers.ppo_config import PPOConfig


def test_only_input_paths_that_exist_beside_the_recipe_move(tmp_path):
    (tmp_path / "rows.jsonl").write_text("")
    (tmp_path / "model").mkdir()
    raw = {"model": {"path": "model"}, "data": {"path": "rows.jsonl", "eval_path": "missing.jsonl", "task": "rows.jsonl"},
           "critic": {"path": "/abs/model"}, "trainer": {"save_path": "model", "run_dir": "model"}}
    out = resolve_recipe_paths(raw, tmp_path)
    assert out["model"]["path"] == str(tmp_path / "model") and out["data"]["path"] == str(tmp_path / "rows.jsonl")
    assert out["data"]["eval_path"] == "missing.jsonl"  # not there: the working directory's, as written
    assert out["data"]["task"] == "rows.jsonl" and out["critic"]["path"] == "/abs/model"  # not a path key / absolute
    assert out["trainer"] == {"save_path": "model", "run_dir": "model"}  # what a run writes: the working directory's
    assert raw["model"]["path"] == "model"  # the input is not changed


def test_a_recipe_beside_its_data_runs_from_elsewhere_and_overrides_stay_cwd_relative(tmp_path, monkeypatch):
    recipe_dir = tmp_path / "project"
    recipe_dir.mkdir()
    (recipe_dir / "rows.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    recipe = recipe_dir / "r.yaml"
    repo = os.getcwd()
    recipe.write_text(f"model: {{path: {repo}/checkpoints/arith-sft}}\ndata: {{path: rows.jsonl}}\n")
    monkeypatch.chdir(tmp_path)
    assert load_config(PPOConfig, recipe).data.path == str(recipe_dir / "rows.jsonl")
    assert merge_recipe(recipe, ["data.path=rows.jsonl"])["data"]["path"] == "rows.jsonl"  # an override: cwd's


def test_the_shipped_recipes_keep_their_root_relative_paths():
    for name in ("grpo_arithmetic", "grpo_gsm8k", "agent_calculator"):
        merged = merge_recipe(f"recipes/{name}.yaml")
        assert merged["model"]["path"].startswith("checkpoints/"), merged["model"]
    assert merge_recipe("recipes/grpo_gsm8k.yaml")["data"]["path"] == "recipes/data/gsm8k_sample.jsonl"
