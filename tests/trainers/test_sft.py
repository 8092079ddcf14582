"""`run_sft`: a few steps on a tiny model lower the completion loss and save a loadable checkpoint."""

import json
import shutil

import torch

from baton.config import load_config
from baton.models import build_char_tokenizer, build_tiny_model, load_model, load_tokenizer
from baton.trainers.session.in_process import InProcessTrainerConfig
from baton.trainers.sft import (
    IGNORE, SFTConfig, SFTDataConfig, SFTModelConfig, SFTOptimConfig, collate_examples, run_sft,
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
        model=SFTModelConfig(preset="0.75m", overrides={"layers": 2}),
        data=SFTDataConfig(num_examples=200, eval_size=4, eval_samples=2),
        optim=SFTOptimConfig(lr=1e-2, lr_warmup_steps=1),
        trainer=InProcessTrainerConfig(steps=5, batch_size=16, run_dir=str(tmp_path / "run"), progress=False,
                                       save_path=str(tmp_path / "ckpt")),
    )
    torch.manual_seed(0)
    res = run_sft(cfg)
    assert len(res["losses"]) == 5
    assert res["loss_last"] < res["loss_first"] - 0.5, res["losses"]  # random init starts near ln(260)=5.6
    assert 0.0 <= res["eval/accuracy_greedy"] <= 1.0 and 0.0 <= res["eval/accuracy_sampled"] <= 1.0
    logged = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in logged] == [0, 1, 2, 3, 4, 5]  # step 0: the starting model's evaluation
    assert "eval/accuracy_greedy" in logged[0] and res["start/eval/accuracy_greedy"] == logged[0]["eval/accuracy_greedy"]
    assert all("sft/loss" in r for r in logged[1:])
    # samples.jsonl: a few greedy held-out completions at step 0 and at the last evaluation
    samples = [json.loads(line) for line in open(tmp_path / "run" / "samples.jsonl")]
    assert sorted({r["step"] for r in samples}) == [0, 5] and len(samples) == 8  # 4 held-out rows, 2 evaluations
    assert all(set(r) >= {"prompt", "completion", "reward", "answer"} and r["reward"] in (0.0, 1.0) for r in samples)
    from baton.metrics import report_panels
    assert "sft/loss" in dict((t, k) for t, k, _ in report_panels(logged))["loss"]
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


def test_sft_resumes_exactly_and_never_writes_a_shipped_checkpoint(tmp_path):
    """SFT runs in the run session: interrupted after step 2 of 4 (save_every=2) and resumed,
    it ends with the same weights as the uninterrupted run; nothing is exported by default."""
    def cfg(run_dir, steps, *extra):
        return load_config(SFTConfig, overrides=[
            "model.overrides={layers: 1}", "data.num_examples=64", "data.eval_size=0", "trainer.batch_size=8",
            f"trainer.steps={steps}", "trainer.save_every=2", f"trainer.run_dir={run_dir}", "trainer.progress=false",
            "optim.lr_warmup_steps=1", *extra])

    full = run_sft(cfg(tmp_path / "full", 4))
    shutil.copytree(tmp_path / "full", tmp_path / "part")  # as if stopped after step 2's checkpoint
    shutil.rmtree(tmp_path / "part" / "checkpoints" / "step_4")
    part = run_sft(cfg(tmp_path / "part", 4, "trainer.resume=auto"))
    assert part["losses"] == full["losses"][2:]
    a = load_model(tmp_path / "full" / "checkpoints" / "step_4").state_dict()
    b = load_model(tmp_path / "part" / "checkpoints" / "step_4").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert "save_path" not in full and SFTConfig().trainer.save_path is None
