"""docs/OWN_DATA.md's worked example (examples/own_data/), run as the page says: its sh block's
commands, one by one, in a copy of the example directory that keeps its place beside the
repository's checkpoints/ (the recipes' `../../checkpoints/arith-sft` resolves against the
recipe's directory), with fewer steps and smaller batches appended."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "OWN_DATA.md"
EXAMPLE = REPO / "examples" / "own_data"
FAST = {  # appended to the doc's commands: 2 steps, small batches, quiet
    "sft": ["trainer.steps=2", "trainer.batch_size=4", "data.eval_size=4", "data.eval_samples=1",
            "trainer.progress=false"],
    "train": ["trainer.steps=2", "data.prompts_per_step=4", "rollout.n=4", "data.eval_size=4",
              "actor.mini_batch_size=16", "actor.micro_batch_size=16", "trainer.progress=false",
              "placement.threads_per_worker=1"],
    "eval": ["--n", "4"],
}


def doc_commands() -> list[list[str]]:
    """The worked example's commands (comments dropped), as argv lists."""
    block = re.search(r"## A worked example\n.*?```sh\n(.*?)```", DOC.read_text(), re.S).group(1)
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.split("#", 1)[0].strip()]


def run_baton(cwd: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("BATON_USER_PATH", None)
    return subprocess.run([sys.executable, "-c", "import sys; from baton.cli import main; sys.exit(main())", *argv],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_doc_s_worked_example_runs(tmp_path):
    (tmp_path / "checkpoints").symlink_to(REPO / "checkpoints")
    shutil.copytree(EXAMPLE, tmp_path / "examples" / "own_data", ignore=shutil.ignore_patterns("runs", "__pycache__"))
    commands = doc_commands()
    assert commands[0] == ["cd", "examples/own_data"] and [c[1] for c in commands[1:]] == ["sft", "train", "eval"]
    cwd, outputs = tmp_path / commands[0][1], []
    for argv in commands[1:]:
        argv = [a.replace("step_30", "step_2").replace("step_40", "step_2") for a in argv[1:]]  # 2 steps each
        run = run_baton(cwd, argv + FAST[argv[0]])
        assert run.returncode == 0, (argv, run.stderr[-3000:])
        outputs.append(run.stdout)
    metrics = [json.loads(ln) for ln in (cwd / "runs/own_data/metrics.jsonl").read_text().splitlines()]
    step = [m for m in metrics if m["step"] == 2][0]
    assert "reward/tied_group_frac" in step and step.get("reward/errors", 0) == 0, step
    samples = [json.loads(ln) for ln in (cwd / "runs/own_data/samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2} and set(samples[0]) == {"step", "prompt", "completion", "reward",
                                                                          "answer"}
    assert "sampled completions at step 2" in outputs[1]
    assert "on 4 held-out prompts" in outputs[2]  # the recipe's eval.jsonl, relative to grpo.yaml


def test_most_groups_tied_warns_once_naming_the_reward(tmp_path):
    (tmp_path / "checkpoints").symlink_to(REPO / "checkpoints")
    cwd = tmp_path / "examples" / "own_data"
    shutil.copytree(EXAMPLE, cwd, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    (cwd / "flat.py").write_text("def zero(prompt, completion, **row):\n    return 0.0\n")
    run = run_baton(cwd, ["train", "grpo.yaml", 'reward.functions={"flat:zero": 1.0}', *FAST["train"],
                          "trainer.run_dir=flat"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("of groups have tied rewards") == 1, run.stderr[-3000:]
    assert "step 1: 100% of groups have tied rewards" in run.stderr and "rewards from flat:zero" in run.stderr
    last = json.loads((cwd / "flat" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["reward/tied_group_frac"] == 1.0 and last["reward/tied_steps"] == 2
