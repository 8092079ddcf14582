"""Load and save models/tokenizers from local Hugging Face directories (never the hub).

`save_pretrained` is atomic and durable (`baton.runs.checkpoints.atomic_dir`: written into
a temp dir beside the target, fsynced, renamed into place), so a crash mid-save leaves
either the old checkpoint or the new one, never a half-written directory that a resumed run
would try to load.

A LoRA run's checkpoint (a PEFT adapter dir: adapter_config.json + adapter_model.safetensors,
no model weights; a run's checkpoint also holds the base's config.json and tokenizer) loads as its base model (the adapter config's `base_model_name_or_path`)
with the adapter merged in, so `baton eval` and `baton serve` take it as they take a full
checkpoint; if the base is not there, `ModelLoadError` says to merge it with `baton export`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from baton.models.validate import ModelLoadError, check_checkpoint, check_finite, check_tokenizer, is_adapter_dir
from baton.runs.checkpoints import atomic_dir

__all__ = ["ModelLoadError", "adapter_base", "build_like", "load_model", "load_tokenizer", "save_pretrained", "untie_lm_head"]


def _check_dir(path: str | os.PathLike, what: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise ModelLoadError(f"{what} directory not found: {str(p)!r} (baton only loads local checkpoints)")
    return p


def adapter_base(path: str | os.PathLike) -> Path | None:
    """The base model dir of a PEFT adapter dir (an adapter_config.json and no model weights;
    a LoRA run's checkpoint also holds its base's config.json), or None if `path` is not an
    adapter dir. ModelLoadError if the base is not found; a relative base path is tried from
    the working directory, then from the adapter dir."""
    p = Path(path)
    if not is_adapter_dir(p):
        return None
    base = json.loads((p / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    for cand in ([Path(base)] + ([p / base] if not Path(base).is_absolute() else [])) if base else []:
        if (cand / "config.json").is_file():
            return cand
    raise ModelLoadError(f"{str(p)!r} is a LoRA adapter whose base model {base!r} is not found here: run "
                         f"`baton export {p} OUT_DIR --merge --base BASE_DIR` and use OUT_DIR")


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> PreTrainedModel:
    """Load a causal LM from a local HF directory, in `dtype`, on `device`, in eval mode. A
    LoRA adapter dir loads as its base with the adapter merged in (`adapter_base`). The
    directory is checked first and the weights after (`baton.models.validate`: whole files,
    the architecture's tensors and shapes, finite values): ModelLoadError, one line."""
    p = _check_dir(path, "model")
    base = adapter_base(p)
    if base is not None:
        from peft import PeftModel

        check_checkpoint(p)
        check_checkpoint(base)
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype, local_files_only=True)
        untie_lm_head(model, json.loads((p / "adapter_config.json").read_text()))
        model = PeftModel.from_pretrained(model, str(p)).merge_and_unload()
        check_finite(model, p)
        return model.to(device).eval()
    if not (p / "config.json").is_file():
        raise ModelLoadError(f"{str(p)!r} holds no config.json: not a HF model directory")
    check_checkpoint(p)
    model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, local_files_only=True)
    check_finite(model, p)
    return model.to(device).eval()


def untie_lm_head(model: torch.nn.Module, adapter_cfg: dict) -> None:
    """Before merging an adapter that targets `lm_head` into a model whose lm_head shares the
    input embedding's weight: give lm_head a weight of its own (and say so in the config), or
    the merge would add the lm_head delta to the embedding as well."""
    targets = adapter_cfg.get("target_modules") or []
    if "lm_head" in targets and getattr(model.config, "tie_word_embeddings", False):
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=head.weight.requires_grad)
        model.config.tie_word_embeddings = False


def build_like(model: torch.nn.Module, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> PreTrainedModel:
    """A plain (unwrapped, unsharded) module of `model`'s architecture and dtype (or `dtype`),
    with its own freshly initialised storage (e.g. an engine's copy of a sharded trainer's
    weights, or a bf16 copy of fp32 master weights for an engine on a GPU)."""
    dtype = dtype or next(model.parameters()).dtype
    with torch.random.fork_rng(devices=[]):  # do not move the caller's RNG
        copy = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
    return copy.to(device).eval()


def load_tokenizer(path: str | os.PathLike):
    """Load a tokenizer from a local HF directory; make sure it has a pad token and that it
    encodes text (ModelLoadError, one line, otherwise: `baton.models.validate.check_tokenizer`)."""
    p = _check_dir(path, "tokenizer")
    if not (p / "tokenizer_config.json").is_file() and (base := adapter_base(p)) is not None:
        p = base  # an adapter saved without its tokenizer: the base's
    try:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError, TypeError) as e:  # no tokenizer files, a torn tokenizer.json, ...
        raise ModelLoadError(f"{p}: no tokenizer loads from it ({str(e).strip().splitlines()[0]})") from None
    check_tokenizer(tok, p)
    if tok.pad_token_id is None:  # batching needs a pad id; EOS is the usual stand-in
        tok.pad_token = tok.eos_token
    return tok


def save_pretrained(model: PreTrainedModel, tokenizer, path: str | os.PathLike,
                    extra: Callable[[Path], None] | None = None,
                    state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write model (safetensors) + tokenizer (may be None) to `path` atomically and durably
    (`baton.runs.checkpoints.atomic_dir`: a crash leaves the old or the new directory, never
    a half-written one); `extra(tmp_dir)` may add files (e.g. optimizer state). Returns it.
    `state_dict`: the tensors to write instead of the module's own (a sharded module's
    gathered full tensors)."""
    target = Path(path).resolve()
    with atomic_dir(target) as tmp:
        if state_dict is None:
            model.save_pretrained(str(tmp))
        else:
            model.save_pretrained(str(tmp), state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if extra is not None:
            extra(tmp)
    return target
