"""The `baton` command: config errors are one clear line and exit code 2."""

from baton.cli import main


def test_unknown_key_exits_2_naming_it(capsys):
    assert main(["train", "recipes/grpo_arithmetic.yaml", "trainer.stpes=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'trainer.stpes'" in err and "did you mean 'trainer.steps'" in err


def test_wrong_type_exits_2_naming_it(capsys):
    assert main(["train", "recipes/grpo_arithmetic.yaml", "rollout.n=many"]) == 2
    assert "config key 'rollout.n' expects int, got 'many'" in capsys.readouterr().err


def test_make_tiny_then_eval(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "m"), "--preset", "0.75m"]) == 0
    assert main(["eval", str(tmp_path / "m"), "--n", "4", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "greedy   accuracy" in out and "sampled  accuracy" in out
