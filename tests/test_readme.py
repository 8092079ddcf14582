"""The README's controller example runs and prints what the README says (local and Ray)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


@pytest.mark.ray
@pytest.mark.slow  # ~17 s: a Ray of its own in a subprocess (the controller on Ray: tests/controller)
def test_readme_controller_example(tmp_path):
    text = README.read_text()
    code = re.search(r"## The single controller in a few lines\n\n```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                         env=env, cwd=tmp_path).stdout
    for line in re.findall(r"prints `(.*?)` and `(.*?)`", text)[0]:
        assert line in out, (line, out)


def test_quickstart_is_the_two_commands():
    block = re.search(r"## Quickstart\n.*?```bash\n(.*?)```", README.read_text(), re.S).group(1)
    commands = [ln for ln in block.splitlines() if ln and not ln.startswith("#")]
    # torch's CPU build wherever it runs (PyTorch's CPU index asked for torch alone), then baton
    torch = ".venv/bin/pip install -q torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu"
    assert commands == [
        f'python3 -m venv .venv && {torch} && .venv/bin/pip install -q -e ".[cpu]" && .venv/bin/baton train '
        'recipes/grpo_arithmetic.yaml',
        f'python3 -m venv .venv && {torch} && .venv/bin/pip install -q -e ".[cpu,test]" && .venv/bin/python -m pytest -q']
    # CI runs the README's test command as it is written
    assert commands[1] in (README.parent / ".ci" / "run").read_text().splitlines()
    # a GPU machine's test install leaves torch alone: the test extra does not name torch
    import tomllib

    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(d.startswith("torch") for d in extras["test"]) and '".[test]"' in README.read_text()


def test_commands_files_and_agent_evals_the_readme_names_exist():
    """Every `baton X` of the Commands table is a subcommand; every recipe, doc and example
    path the README names exists; its `baton eval` lines parse."""
    from baton.cli import build_parser

    text = README.read_text()
    repo = README.parent
    table = re.search(r"## Commands\n(.*?)\n## ", text, re.S).group(1)
    subcommands = set(build_parser()._subparsers._group_actions[0].choices)
    named = set(re.findall(r"^\| `baton ([a-z-]+)", table, re.M))
    assert named and named <= subcommands, named - subcommands
    for path in set(re.findall(r"\b((?:recipes|docs|examples|checkpoints)/[\w./-]+?)(?=[`)\s,:;]|$)", text)):
        if "step_" not in path and not path.endswith("/"):
            assert (repo / path.rstrip(".")).exists(), path
    evals = re.findall(r"^\s*baton eval (\S+ --recipe \S+)", text, re.M)
    assert evals, "the README evaluates the agent with baton eval"
    for line in evals:
        args = build_parser().parse_args(["eval", *line.split()])
        assert (repo / args.recipe[0]).is_file()


def test_the_demo_is_not_described_as_running_ahead():
    start = README.read_text().split("## Commands")[0]
    assert "one_step_off" not in start and "1.2–1.7x" not in start


def test_readme_tools_example_runs(capsys):
    """The README's tools example against `baton serve checkpoints/calc-tools` (in process, on
    a free port): it prints what its comments say, a parsed call and the copied answer."""
    import torch

    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.rollout.server import ServerThread, build_app

    pytest.importorskip("llguidance")  # tool_choice="required": constrained decoding
    text = README.read_text()
    code = re.search(r"Tools end to end with the shipped.*?```python\n(.*?)```", text, re.S).group(1)
    expected = [c.split(": ")[0] if c[0].isdigit() else c for c in re.findall(r"^print\(.*?# (.*)$", code, re.M)]
    model_dir = str(README.parent / "checkpoints" / "calc-tools")
    tok = load_tokenizer(model_dir)
    engine = EmbeddedEngine(load_model(model_dir, dtype=torch.float32, device="cpu"), tok)
    server = ServerThread(build_app(engine, tok, "calc-tools", model_path=model_dir))
    try:
        exec(compile(code.replace("http://127.0.0.1:8000", server.url), "README tools example", "exec"), {})
    finally:
        server.stop()
    assert capsys.readouterr().out.splitlines() == expected


def test_readme_python_example_runs(tmp_path):
    """The "From Python" example, as a plain script, with 1 step and fewer rows per step."""
    code = re.search(r"## From Python\n.*?```python\n(.*?)```", README.read_text(), re.S).group(1)
    given = '"trainer.steps": 60, "trainer.run_dir": "runs/from_python"'
    assert given in code
    code = code.replace(given, f'"trainer.steps": 1, "trainer.run_dir": {str(tmp_path / "run")!r}, '
                               '"data.prompts_per_step": 8, "data.eval_size": 16, "rollout.n": 4, '
                               '"actor.mini_batch_size": 32, "actor.micro_batch_size": 32, "trainer.progress": False')
    (tmp_path / "example.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(README.parent), "BATON_ROWS_CACHE": str(tmp_path / "rows")}
    out = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True,
                         timeout=300, env=env, cwd=README.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert re.fullmatch(r"held-out accuracy \d\.\d{3} -> \d\.\d{3}", lines[-3]), lines
    assert "'eval/accuracy_greedy'" in lines[-2] and re.fullmatch(r"\['-?\d*', '-?\d*'\]", lines[-1]), lines
