"""A LoRA adapter on `lm_head` of a model whose lm_head shares the input embedding's weight
(tied, as the tiny models and many small ones are): merged (`baton export --merge`, and an
adapter dir loaded by `load_model`), the model computes what base + adapter computes; the
merge must not fold the lm_head delta into the shared embedding as well."""

from __future__ import annotations

import torch

from baton.models.load import load_model
from baton.models.lora import (LoraAdapterConfig, adapter_config, adapter_tensors, apply_lora, merge_adapter_dir,
                               save_adapter)
from baton.models.make import make_tiny_checkpoint


def test_merging_an_lm_head_adapter_of_a_tied_model(tmp_path):
    base_dir = make_tiny_checkpoint(tmp_path / "base", preset="0.2m", seed=0)
    model = apply_lora(load_model(base_dir), LoraAdapterConfig(rank=4, alpha=8, target_modules=["q_proj", "lm_head"]))
    assert model.config.tie_word_embeddings
    with torch.no_grad():
        for _, p in adapter_tensors(model):
            p.normal_(0, 0.05)  # B != 0: the adapter changes the outputs
    ids = torch.tensor([[5, 9, 33, 70, 12, 8]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
    (tmp_path / "adapter").mkdir()
    save_adapter(adapter_tensors(model), adapter_config(model, base_dir), tmp_path / "adapter")
    merged = load_model(merge_adapter_dir(tmp_path / "adapter", tmp_path / "merged", base_path=base_dir))
    loaded = load_model(tmp_path / "adapter")  # an adapter dir loads as its base with the adapter merged
    with torch.no_grad():
        for m in (merged, loaded):
            assert (m(input_ids=ids).logits - want).abs().max() < 1e-4
