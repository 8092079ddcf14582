"""A run that chooses an environment adapter whose extra is not installed stops at its config
check: one line naming the pip command, exit 2, nothing written. Runs in every venv (the
import is made to fail here whether or not the package is installed)."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module,extra,argv", [
    ("reasoning_gym", "reasoning-gym", ["train", "recipes/envs/grpo_reasoning_gym.yaml"]),
    ("verifiers", "verifiers", ["train", "recipes/envs/grpo_verifiers.yaml"]),
    ("verifiers", "verifiers", ["train", "recipes/envs/grpo_verifiers_multiturn.yaml"]),
    ("openenv", "openenv", ["train", "recipes/envs/grpo_openenv.yaml"]),
])
def test_missing_extra_is_one_line_exit_2(module, extra, argv, monkeypatch, capsys, tmp_path):
    from baton.cli import main

    for name in [module, *(m for m in sys.modules if m.startswith(module + "."))]:
        monkeypatch.setitem(sys.modules, name, None)  # `import module(.sub)` -> ModuleNotFoundError
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "never-written"
    assert main([*argv, f"trainer.run_dir={run_dir}"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("baton: config error: ") and last.endswith(f"pip install -e '.[{extra}]'"), last
    assert f"'{extra}' extra ({module} is not installed)" in last
    assert not run_dir.exists()


def test_the_verifiers_agent_with_another_task_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    """The verifiers gateway agent runs rows of data.task=verifiers only: another task is a
    config error naming the fix (it was an agent_error on every session, at run time)."""
    from baton.cli import main

    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "never-written"
    argv = ["train", "recipes/envs/grpo_verifiers_multiturn.yaml", "data.task=arithmetic", "data.task_args={}",
            f"trainer.run_dir={run_dir}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("baton: config error: "), err
    assert "gateway.agent=baton.envs.verifiers_env:episode runs rows of data.task=verifiers" in err, err
    assert not run_dir.exists()
