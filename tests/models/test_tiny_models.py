"""Tiny model presets, local load/save through Auto classes, and atomic checkpoint writes."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from baton.models import (
    PRESETS, build_char_tokenizer, build_tiny_model, count_params, load_model, load_tokenizer,
    make_tiny_checkpoint, save_pretrained,
)


def test_presets_have_the_advertised_sizes():
    expected = {"0.2m": 0.21e6, "0.75m": 0.82e6, "2m": 2.2e6, "5m": 4.8e6, "25m": 25.3e6,
                "qwen3-moe": 0.24e6, "mixtral": 0.24e6}
    assert set(PRESETS) == set(expected)
    for name in ("0.2m", "0.75m", "2m", "qwen3-moe", "mixtral"):  # the big ones are slow to init on 2 cores
        n = count_params(build_tiny_model(name, vocab_size=260))
        assert abs(n - expected[name]) / expected[name] < 0.05, (name, n)


def test_seeded_init_is_reproducible_and_overrides_apply():
    a = build_tiny_model("0.75m", seed=3, layers=2)
    b = build_tiny_model("0.75m", seed=3, layers=2)
    assert a.config.num_hidden_layers == 2
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="unknown tiny preset"):
        build_tiny_model("huge")
    with pytest.raises(ValueError, match="unknown model family"):
        build_tiny_model("0.75m", family="gpt9")


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_save_and_reload_through_auto_classes(tmp_path, family):
    path = make_tiny_checkpoint(tmp_path / "ckpt", "0.75m", family=family, seed=1, layers=2)
    assert (path / "model.safetensors").is_file()
    ids = torch.tensor([[10, 20, 30, 2]])  # [1, 4]
    ref = build_tiny_model("0.75m", family=family, vocab_size=260, seed=1, layers=2).eval()
    for model in (load_model(path), AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)):
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, ref(ids).logits)
    assert load_tokenizer(path)("3+4=")["input_ids"] == build_char_tokenizer()("3+4=")["input_ids"]
    assert load_model(path, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_missing_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        load_tokenizer(tmp_path / "nope")


class Boom(RuntimeError):
    pass


def test_save_is_atomic(tmp_path, monkeypatch):
    tok = build_char_tokenizer()
    model = build_tiny_model("0.75m", layers=1, seed=0)
    target = tmp_path / "ckpt"

    def fail(*args, **kwargs):
        raise Boom("disk full")

    # 1. A failed first save leaves nothing behind: no target, no temp dir.
    monkeypatch.setattr(type(tok), "save_pretrained", fail)
    with pytest.raises(Boom):
        save_pretrained(model, tok, target)
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()

    # 2. A failed overwrite keeps the old checkpoint whole.
    save_pretrained(model, tok, target)
    before = sorted(os.listdir(target))
    other = build_tiny_model("0.75m", layers=1, seed=1)
    monkeypatch.setattr(type(tok), "save_pretrained", fail)
    with pytest.raises(Boom):
        save_pretrained(other, tok, target)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ckpt"] and sorted(os.listdir(target)) == before
    torch.testing.assert_close(load_model(target).lm_head.weight, model.lm_head.weight)

    # 3. A successful overwrite replaces it and cleans up.
    save_pretrained(other, tok, target)
    assert os.listdir(tmp_path) == ["ckpt"]
    torch.testing.assert_close(load_model(target).lm_head.weight, other.lm_head.weight)
