"""The README's gateway agent, copied as written (its client never closed), trains quietly:
the clients an agent leaves open are closed by their finalizers on whatever loop runs when
the garbage collector finds them, after their own session's loop has closed; that used to
print "Task exception was never retrieved ... Event loop is closed" by the thousand
(`baton.agents.watchdog._left_open` drops exactly those)."""

import gc
import logging
import re
from pathlib import Path

import pytest

from baton.config import load_config
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig

pytest.importorskip("openai")
REPO = Path(__file__).resolve().parents[2]
NOISE = ("Event loop is closed", "never retrieved", "destroyed but it is pending")


def test_the_readme_s_gateway_agent_runs_quietly(tmp_path, monkeypatch, caplog):
    block = re.search(r"```python\n(# my_agent\.py.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block, "the README's gateway example moved: update this test"
    (tmp_path / "my_agent.py").write_text(block.group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(REPO)
    cfg = load_config(PPOConfig, "recipes/agent_calculator.yaml", [
        "data.source=gateway", "gateway.agent=my_agent:solve", "agent=null", "data.task=arithmetic",
        "model.path=checkpoints/arith-sft", "data.prompts_per_step=2", "rollout.n=4", "data.eval_size=4",
        "actor.mini_batch_size=0", "actor.micro_batch_size=8", "trainer.progress=false", "trainer.steps=2",
        f"trainer.run_dir={tmp_path / 'run'}"])
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        train(cfg)
        gc.collect()  # the clients left open are finalized by now, wherever they are
    noise = [r.getMessage() for r in caplog.records if any(n in r.getMessage() for n in NOISE)]
    assert not noise, noise[:3]
