"""Direction of one real SFT step (baton/trainers/sft.py on a fresh tiny model): the loss
is cross-entropy on the completion tokens only, so after one step the target tokens'
logprobs rose (Adam's first step lowers the mean NLL to first order, as argued in
tests/direction/test_ppo_family.py), and the prompt positions are not targets: row
"12+7=" -> "19" + EOS has labels -100 on every prompt position, then the ids of "19", EOS.
"""

from __future__ import annotations

import torch

from baton.config import load_config
from baton.trainers import sft

from .harness import REPO


def target_logprobs(model, batch) -> torch.Tensor:
    """[B, T-1] logprob of each next token, 0 where the label is IGNORE."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    keep = labels != sft.IGNORE
    logp = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    return (logp * keep).double()


def test_sft_step_raises_the_targets_and_ignores_the_prompt(tmp_path, monkeypatch):
    calls = []
    real = sft.completion_loss

    def completion_loss(model, batch):
        if not calls:
            calls.append((model, batch, target_logprobs(model, batch)))
        return real(model, batch)

    monkeypatch.setattr(sft, "completion_loss", completion_loss)
    examples = []
    real_encode = sft.encode_examples
    monkeypatch.setattr(sft, "encode_examples", lambda *a: examples.extend(real_encode(*a)) or examples)
    cfg = load_config(sft.SFTConfig, REPO / "recipes" / "sft_arithmetic.yaml",
                      ["data.num_examples=32", "data.eval_size=0", "trainer.batch_size=16", "trainer.steps=1",
                       "optim.lr=1e-3", "optim.lr_warmup_steps=0", f"trainer.run_dir={tmp_path}",
                       "trainer.progress=false"])
    sft.run_sft(cfg)
    model, batch, before = calls[0]
    model.eval()
    after = target_logprobs(model, batch)
    assert float((after - before).sum()) > 0, "the step lowered the targets' likelihood"
    # labels: IGNORE on the prompt, the target + EOS after it (each example's own prompt length)
    ids_of = {tuple(ids): plen for ids, plen in examples}
    for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
        n = int(mask.sum())
        plen = ids_of[tuple(ids[:n].tolist())]
        assert (labels[:plen] == sft.IGNORE).all() and torch.equal(labels[plen:n], ids[plen:n])
        assert (labels[n:] == sft.IGNORE).all()
