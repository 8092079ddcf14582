"""`run_sft`: a few steps on a tiny model lower the completion loss and save a loadable checkpoint."""

import json

import torch

from baton.config import load_config
from baton.models import build_char_tokenizer, build_tiny_model, load_model, load_tokenizer
from baton.trainers.sft import (
    IGNORE, DataSection, ModelSection, OptimSection, SFTConfig, TrainerSection, collate_examples, run_sft,
)
from baton.workers.optim import build_optimizer


def test_labels_cover_only_the_completion():
    tok = build_char_tokenizer()
    ex = [(tok("1+2=")["input_ids"] + tok("3")["input_ids"] + [2], 4), (tok("10+2=12")["input_ids"] + [2], 5)]
    b = collate_examples(ex, tok.pad_token_id)
    assert b["input_ids"].shape == (2, 8)
    assert b["labels"][0].tolist() == [IGNORE] * 4 + [tok("3")["input_ids"][0], 2] + [IGNORE] * 2
    assert b["labels"][1, 5:].tolist() == tok("12")["input_ids"] + [2]
    assert b["attention_mask"].sum(1).tolist() == [6, 8]


def test_five_steps_lower_the_loss_and_save(tmp_path):
    cfg = SFTConfig(
        model=ModelSection(preset="0.75m", overrides={"layers": 2}),
        data=DataSection(num_examples=200, eval_size=4, eval_samples=2),
        optim=OptimSection(lr=1e-2, warmup_steps=1),
        trainer=TrainerSection(steps=5, batch_size=16, log_every=1, run_dir=str(tmp_path / "run"),
                               save_path=str(tmp_path / "ckpt")),
    )
    torch.manual_seed(0)
    res = run_sft(cfg)
    assert len(res["losses"]) == 5
    assert res["loss_last"] < res["loss_first"] - 0.5, res["losses"]  # random init starts near ln(260)=5.6
    assert 0.0 <= res["eval/accuracy_greedy"] <= 1.0 and 0.0 <= res["eval/accuracy_sampled"] <= 1.0
    logged = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5]
    assert load_config(SFTConfig, tmp_path / "run" / "config.yaml").trainer.steps == 5  # a GRPO run's config.yaml
    model, tok = load_model(tmp_path / "ckpt"), load_tokenizer(tmp_path / "ckpt")
    assert model.config.num_hidden_layers == 2 and len(tok) == 260


def test_no_weight_decay_on_norms_and_biases():
    model = build_tiny_model("0.75m", vocab_size=260, layers=1)
    optim, _ = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.98), warmup_steps=0,
                               total_steps=1, schedule="constant", no_decay_1d=True)
    decay, rest = optim.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.ndim >= 2 for p in decay["params"])
    assert rest["weight_decay"] == 0.0 and rest["params"] and all(p.ndim == 1 for p in rest["params"])
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))
