"""`baton eval` for any checkpoint (a recipe's task and rows, agents included) and what
`baton make-tiny` says."""

import pytest

from baton.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from baton.models.make import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m"))


def test_make_tiny_says_what_it_wrote_and_lists_its_presets(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "m"), "--preset", "0.75m"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert str(tmp_path / "m") in line and "preset 0.75m" in line and "821,888 parameters" in line
    with pytest.raises(SystemExit):
        main(["make-tiny", "--help"])
    assert "--preset {0.2m,0.75m,2m,5m,25m,qwen3-moe,mixtral}" in capsys.readouterr().out


def test_eval_as_a_recipe_does(tiny, tmp_path, capsys):
    held = tmp_path / "held.jsonl"
    held.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{path: {tiny}}}\ndata: {{path: held.jsonl, eval_path: held.jsonl}}\n"
                      "rollout: {max_new_tokens: 3}\n")
    assert main(["eval", tiny, "--recipe", str(recipe)]) == 0  # held.jsonl: next to the recipe
    assert "on 2 held-out prompts" in capsys.readouterr().out
    assert main(["eval", tiny, "--recipe", "recipes/grpo_arithmetic.yaml", "--n", "3"]) == 0
    assert "greedy   accuracy" in capsys.readouterr().out


def test_eval_an_agent_checkpoint_with_its_recipe(capsys):
    assert main(["eval", "checkpoints/calc-sft-mixed", "--recipe", "recipes/agent_calculator.yaml",
                 "agent.max_turns=1", "agent.turn_max_new_tokens=8", "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert "(2 held-out problems, greedy)" in out and "with the tool:" in out and "without the tool:" in out


def test_eval_recipe_errors_are_one_line(tiny, capsys):
    assert main(["eval", tiny, "--recipe", "recipes/grpo_arithmetic.yaml", "data.eval_sise=3"]) == 2
    assert "unknown config key 'data.eval_sise'" in capsys.readouterr().err
    assert main(["eval", tiny, "--recipe", "recipes/rm_arithmetic.yaml"]) == 2
    assert "has no task to evaluate on" in capsys.readouterr().err
