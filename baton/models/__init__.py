"""Models and tokenizers: local HF loading/saving, tiny model presets, a char tokenizer."""

from baton.models.load import load_model, load_tokenizer, save_pretrained
from baton.models.make import make_tiny_checkpoint
from baton.models.tiny import PRESETS, build_tiny_model, count_params, tiny_config
from baton.models.tokenizer import build_char_tokenizer

__all__ = [
    "PRESETS", "build_char_tokenizer", "build_tiny_model", "count_params", "load_model",
    "load_tokenizer", "make_tiny_checkpoint", "save_pretrained", "tiny_config",
]
