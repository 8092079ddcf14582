"""A LoRA run's checkpoint (adapter_config.json + adapter_model.safetensors beside its base's
config.json and tokenizer) evaluates and serves on its base, as the README says (issue 38:
the config.json made the adapter detection answer "not an adapter", then "no file named
model.safetensors"). The checkpoint is a real one: a 1-step GRPO run with model.lora.rank=8.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.cli import main

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes/grpo_arithmetic.yaml")
TINY = ["data.prompts_per_step=2", "data.eval_size=2", "rollout.n=2", "rollout.max_new_tokens=2",
        "actor.micro_batch_size=4", "actor.mini_batch_size=4", "trainer.progress=false", "trainer.eval_every=0",
        "placement.auto=false", "placement.threads_per_worker=1", "reward.max_workers=1",
        f"model.path={REPO / 'checkpoints/arith-sft'}", "model.lora.rank=8"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    assert main(["train", RECIPE, *TINY, "trainer.steps=1", "trainer.save_every=1",
                 f"trainer.run_dir={run_dir}"]) == 0
    return run_dir


def test_eval_of_a_lora_run_s_checkpoint_with_and_without_its_recipe(lora_run, capsys):
    ckpt = lora_run / "checkpoints/step_1"
    assert (ckpt / "config.json").is_file() and (ckpt / "adapter_config.json").is_file()
    capsys.readouterr()
    assert main(["eval", str(ckpt), "--n", "2", "--max-new-tokens", "2"]) == 0
    assert "on 2 held-out prompts" in capsys.readouterr().out
    assert main(["eval", str(ckpt), "--recipe", RECIPE, *TINY]) == 0
    assert "on 2 held-out prompts" in capsys.readouterr().out


def test_serve_loads_a_lora_run_s_checkpoint_as_its_base_with_the_adapter(lora_run):
    """What `baton serve` loads (serve_main: load_model + load_tokenizer), and that the
    adapter is in it: the merged weights differ from the base's."""
    from baton.models.load import load_model, load_tokenizer

    merged = load_model(lora_run / "checkpoints/step_1")
    base = load_model(REPO / "checkpoints/arith-sft")
    assert load_tokenizer(lora_run / "checkpoints/step_1")("1+2=")["input_ids"]
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not merged.state_dict()[name].equal(base.state_dict()[name])
