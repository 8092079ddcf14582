"""Tiny byte tokenizers carrying real chat templates' special tokens (tests/fixtures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.models.tokenizer import build_char_tokenizer

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"


def templated_tokenizer(name: str):
    tok = build_char_tokenizer()
    if name == "qwen2_5":
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tok.eos_token = "<|im_end|>"
    elif name == "llama3":
        tok.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>",
                                                              "<|eot_id|>"]})
        tok.eos_token = "<|eot_id|>"
    tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    return tok


@pytest.fixture
def qwen_tok():
    return templated_tokenizer("qwen2_5")


@pytest.fixture
def llama_tok():
    return templated_tokenizer("llama3")
