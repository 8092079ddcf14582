"""The `model:` section of a recipe: which local HF directory a role loads, in which dtype,
and optionally LoRA adapters on it (`model.lora`, see `baton.models.lora`). `check()`: the
directory exists and holds a config.json (a ConfigError, one line, before a run writes
anything; the drivers' `open_run` calls it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from baton.models.lora import LoraAdapterConfig
from baton.models.validate import WEIGHT_FILES

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}  # float64: exact numerics checks


def check_model_path(path: str, key: str = "model.path") -> None:
    """ConfigError (one line) unless `path` is a local HF model directory (with a config.json)."""
    from baton.config import ConfigError

    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{key}={path}: no such directory (baton loads local HF checkpoints only; "
                          f"`baton make-tiny DIR` writes a tiny one)")
    if not (p / "config.json").is_file():
        hint = (": a LoRA adapter, not a model; give its base model, or merge it with `baton export --merge`"
                if (p / "adapter_config.json").is_file() else "")
        raise ConfigError(f"{key}={path}: holds no config.json, so it is not a HF model directory{hint}")
    if not any((p / f).is_file() for f in WEIGHT_FILES):
        hint = (": a LoRA run's checkpoint (an adapter), not a model; give its base model, or merge it with "
                "`baton export --merge`" if (p / "adapter_config.json").is_file() else "")
        raise ConfigError(f"{key}={path}: holds a config.json but no weights (one of {', '.join(WEIGHT_FILES)})"
                          f"{hint}")
    from baton.models.load import load_tokenizer
    from baton.models.validate import check_checkpoint

    check_checkpoint(p)  # whole files, the architecture's tensors and shapes (ModelLoadError, one line)
    load_tokenizer(p)  # a tokenizer that encodes text (a tokenizer dir without tokenizer.json may not)


def check_export_path(path: str | None, key: str = "trainer.save_path") -> None:
    """ConfigError (one line) if `path` already holds a model: a run's export never overwrites
    one it did not write (e.g. the shipped checkpoints/arith-sft)."""
    from baton.config import ConfigError

    if path and any((Path(path) / f).exists() for f in ("config.json", "adapter_config.json")):
        raise ConfigError(f"{key}={path} already holds a model, which this run's export would overwrite: "
                          f"choose another {key} (or delete that one first)")


@dataclass
class ModelConfig:
    path: str = "checkpoints/arith-sft"  # a local HF directory (model + tokenizer)
    # the weights' dtype; bfloat16: the trained roles keep fp32 master weights and compute in bf16
    # (baton.models.precision.master_dtype), the frozen ones (reference) hold bf16
    dtype: Literal["float32", "bfloat16", "float64"] = "float32"
    lora: LoraAdapterConfig | None = None  # train LoRA adapters only (the base stays frozen)

    def check(self, key: str = "model.path") -> None:
        check_model_path(self.path, key)
        if self.lora is not None:
            self.lora.check()

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
