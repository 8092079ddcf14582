"""Models and tokenizers: local HF loading/saving, tiny model presets, a char tokenizer.

The names below are imported on first use (PEP 562), so `import baton.models.presets` (the
command line's --help) does not pay for torch and transformers."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "load_model": "load", "load_tokenizer": "load", "save_pretrained": "load",
    "make_tiny_checkpoint": "make", "PRESETS": "presets", "build_tiny_model": "tiny", "count_params": "tiny",
    "tiny_config": "tiny", "build_char_tokenizer": "tokenizer",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'baton.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"baton.models.{_WHERE[name]}"), name)
