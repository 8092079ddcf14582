"""A `.gguf` file as a model: converted once into an ordinary HF directory in a cache, which
the run then uses like any other (config.yaml, every role and Ray worker read that directory).

    hf_dir = gguf_to_hf_dir("SmolLM2-135M-Instruct.Q4_1.gguf")   # ~/.cache/baton/gguf/<stem>-<key>/

The weights are dequantized to fp32 by transformers' GGUF loader and saved as safetensors
(a run's `model.dtype` applies at load, as for any checkpoint); the tokenizer and its chat
template come from the file's metadata. The loaded config's `quantization_config` is dropped
and the tensors go into a plain model of the architecture, so the directory is an ordinary
checkpoint. The cache key is the file's resolved path, size and modification time; the
directory is written atomically (a temp dir renamed into place), so a crash or a concurrent
conversion never leaves half of one. `BATON_CACHE` moves the cache (default ~/.cache/baton).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from baton.models.gguf_file import check_gguf_file
from baton.models.validate import WEIGHT_FILES

CACHE_ENV = "BATON_CACHE"
SOURCE_FILE = "gguf_source.json"  # what the directory was converted from


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "baton")


def cached_dir(path: str | Path) -> Path:
    """Where GGUF file `path` converts to: keyed by its resolved path, size and mtime."""
    p = Path(path).resolve()
    st = p.stat()
    key = hashlib.sha256(f"{p}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{p.stem}-{key}"


def is_converted(out: Path) -> bool:
    return (out / SOURCE_FILE).is_file() and any((out / f).is_file() for f in WEIGHT_FILES)


def gguf_to_hf_dir(path: str | Path, key: str = "model.path") -> str:
    """The cached HF directory of GGUF file `path`, converting it first if needed. A ConfigError
    (one line) for a file baton cannot read (`check_gguf_file`), before anything is written."""
    arch = check_gguf_file(path, key)
    out = cached_dir(path)
    if not is_converted(out):
        print(f"baton: converting {path} ({arch}) to an HF directory in {out} (once; dequantized to fp32)",
              file=sys.stderr, flush=True)
        convert(Path(path), out)
    return str(out)


def convert(path: Path, out: Path) -> Path:
    """Write the HF directory of GGUF file `path` to `out` atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from baton.models.load import save_pretrained

    hf_logging.disable_progress_bar()
    where, name = str(path.resolve().parent), path.name
    loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses a "gguf-quantized" model
    with torch.random.fork_rng(devices=[]):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    del loaded
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    st = path.stat()
    source = {"gguf": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def note(tmp: Path) -> None:
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n")

    return save_pretrained(plain.eval(), tokenizer, out, extra=note)
