"""Data as users have it, on the embedded path: verl's parquet rows (chat-message prompts
rendered with the tokenizer's template, `reward_model.ground_truth`, `data_source`,
`extra_info`) and GSM8K's jsonl feed `baton train` through `data.path`."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.config import ConfigError, load_config
from baton.envs import ArithmeticTask
from baton.metrics import read_metrics
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig
from baton.trainers.session.state import task_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_verl_parquet_with_chat_prompts_trains_on_the_embedded_path(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rows = ArithmeticTask().train_rows(40, seed=3)
    verl = [{"data_source": "arith", "ability": "math", "extra_info": {"index": i},
             "prompt": [{"role": "user", "content": r["prompt"]}],
             "reward_model": {"style": "rule", "ground_truth": r["answer"]}} for i, r in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(verl), tmp_path / "train.parquet")
    cfg = load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml", [
        f"model.path={REPO / 'checkpoints/arith-sft'}", f"trainer.run_dir={tmp_path / 'run'}",
        f"data.path={tmp_path / 'train.parquet'}", "data.prompts_per_step=4", "rollout.n=4", "data.eval_size=4",
        "actor.mini_batch_size=16", "actor.micro_batch_size=16", "trainer.steps=1", "trainer.progress=false"])
    train_rows, held = task_rows(cfg.data)
    assert len(train_rows) == 36 and len(held) == 4 and held[0]["extra_info"] == {"index": 0}
    result = train(cfg)
    steps = [r for r in read_metrics(tmp_path / "run") if r["step"] == 1]
    # the char tokenizer's template renders a user turn as its text: the warm start answers it
    assert steps and steps[0]["reward/mean"] > 0.1 and result["start/eval/accuracy_greedy"] >= 0


def test_gsm8k_task_needs_its_file():
    with pytest.raises(ConfigError, match="data.path"):
        load_config(PPOConfig, REPO / "recipes/grpo_gsm8k.yaml", ["data.path="])
    cfg = load_config(PPOConfig, REPO / "recipes/grpo_gsm8k.yaml", [])
    train_rows, held = task_rows(cfg.data)
    assert len(train_rows) == 16 and len(held) == 16 and train_rows[0]["prompt"].endswith('"####".')
