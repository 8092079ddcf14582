"""`rollout.response_format`: a recipe constrains its completions (constrained decoding in
the colocated embedded engine); a GRPO step on a tiny random model samples only JSON that
matches the schema (or runs out of tokens), and a bad format is one config error."""

import json

import pytest

from baton.config import ConfigError, load_config
from baton.models.make import make_tiny_checkpoint
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig

pytest.importorskip("llguidance")  # the `structured` extra (in the test extra)

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["answer"]}
FORMAT = "rollout.response_format=" + json.dumps({"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})
TINY = ["data.prompts_per_step=2", "data.eval_size=2", "rollout.n=4", "rollout.max_new_tokens=16",
        "actor.micro_batch_size=8", "actor.mini_batch_size=8", "trainer.progress=false", "trainer.eval_every=0",
        "algo.recompute_old_logprobs=true"]


def test_grpo_step_samples_only_schema_json(tmp_path):
    model = make_tiny_checkpoint(tmp_path / "m", preset="0.75m", seed=0)
    cfg = load_config(PPOConfig, "recipes/grpo_arithmetic.yaml",
                      [f"model.path={model}", f"trainer.run_dir={tmp_path / 'run'}", "trainer.steps=1", *TINY, FORMAT])
    assert cfg.rollout.grammar is not None
    train(cfg)
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert samples
    parsed = 0
    for s in samples:
        try:
            doc = json.loads(s["completion"])
        except ValueError:
            assert len(s["completion"]) >= 10  # only a completion cut by max_new_tokens may not parse
            continue
        assert set(doc) == {"answer"} and 0 <= doc["answer"] <= 99
        parsed += 1
    assert parsed >= len(samples) // 2


def test_a_bad_response_format_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="rollout.response_format"):
        load_config(PPOConfig, "recipes/grpo_arithmetic.yaml", ['rollout.response_format={type: yaml}'])
    with pytest.raises(ConfigError, match="needs constrained decoding"):
        load_config(PPOConfig, "recipes/grpo_arithmetic.yaml", ["rollout.response_format={type: json_object}",
                                                                "rollout.engine=vllm"])
