"""Load and save models/tokenizers from local Hugging Face directories (never the hub).

`save_pretrained` is atomic: it writes into a hidden temp dir next to the target and
renames it into place, so a crash mid-save leaves either the old checkpoint or the new
one, never a half-written directory that a resumed run would try to load.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel


def _check_dir(path: str | os.PathLike, what: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{what} directory not found: {str(p)!r} (baton only loads local checkpoints)")
    return p


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> PreTrainedModel:
    """Load a causal LM from a local HF directory, in `dtype`, on `device`, in eval mode."""
    p = _check_dir(path, "model")
    model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, local_files_only=True)
    return model.to(device).eval()


def load_tokenizer(path: str | os.PathLike):
    """Load a tokenizer from a local HF directory; make sure it has a pad token."""
    p = _check_dir(path, "tokenizer")
    tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    if tok.pad_token_id is None:  # batching needs a pad id; EOS is the usual stand-in
        tok.pad_token = tok.eos_token
    return tok


def _default_permissions(root: Path) -> None:
    """mkdtemp makes 0700 dirs (and some writers 0600 files); give the checkpoint the
    permissions a plain mkdir/open would have, so other users and containers can read it."""
    umask = os.umask(0)
    os.umask(umask)
    root.chmod(0o777 & ~umask)
    for p in root.rglob("*"):
        p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)


def save_pretrained(model: PreTrainedModel, tokenizer, path: str | os.PathLike) -> Path:
    """Write model (safetensors) + tokenizer (may be None) to `path` atomically; return it."""
    target = Path(path).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        _default_permissions(tmp)
        if target.exists():
            # os.replace cannot overwrite a non-empty dir: move the old one aside first,
            # so the window without a checkpoint at `target` is two renames long.
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / "ckpt")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
