"""`baton make-tiny`: write a randomly initialised tiny model + char tokenizer to a directory."""

from __future__ import annotations

import os
from pathlib import Path

from baton.models.load import save_pretrained
from baton.models.tiny import build_tiny_model, count_params
from baton.models.tokenizer import build_char_tokenizer


def make_tiny_checkpoint(out_dir: str | os.PathLike, preset: str = "0.75m", family: str = "qwen2", seed: int = 0, **overrides) -> Path:
    """Build tokenizer + model (vocab sized to the tokenizer), save them atomically to `out_dir`."""
    tok = build_char_tokenizer()
    model = build_tiny_model(preset, family=family, vocab_size=len(tok), seed=seed, **overrides)
    path = save_pretrained(model, tok, out_dir)
    n = count_params(model)
    print(f"wrote {path}: a tiny {model.config.model_type} model, preset {preset}, {n:,} parameters ({n / 1e6:.2f}M), seed {seed}, "
          f"with its tokenizer")
    return path
