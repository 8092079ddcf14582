"""docs/ENVIRONMENTS.md's commands: every recipe a `baton train` / `baton launch` line names
exists and passes its config check (where its extra is installed: CI's extras jobs run this
file in each extra's venv, and the recipes' 2-step runs in tests/envs/test_<extra>.py)."""

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs/ENVIRONMENTS.md"
EXTRA_OF_TASK = {"reasoning_gym": "reasoning_gym", "verifiers": "verifiers"}
EXTRA_OF_AGENT_ENV = {"openenv": "openenv"}


def doc_recipes() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    return [m for b in blocks for m in re.findall(r"^baton (?:train|launch) (recipes/\S+\.yaml)", b, re.M)]


def test_doc_names_the_recipes():
    assert {"recipes/envs/grpo_reasoning_gym.yaml", "recipes/envs/sft_reasoning_gym.yaml",
            "recipes/envs/grpo_verifiers.yaml", "recipes/envs/grpo_verifiers_multiturn.yaml",
            "recipes/envs/grpo_openenv.yaml"} <= set(doc_recipes())


@pytest.mark.parametrize("recipe", doc_recipes())
def test_doc_recipe_passes_its_config_check(recipe, monkeypatch):
    from baton.config import load_config
    from baton.trainers.algorithms import config_class

    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO))
    raw = yaml.safe_load((REPO / recipe).read_text())
    module = EXTRA_OF_TASK.get(raw.get("data", {}).get("task")) or EXTRA_OF_AGENT_ENV.get(raw.get("agent", {}).get("env"))
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"{recipe} needs the {module} extra")
    load_config(config_class(raw.get("algorithm", "grpo")), REPO / recipe)
