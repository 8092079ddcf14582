"""The `model:` section of a recipe: which local HF directory a role loads, in which dtype,
and optionally LoRA adapters on it (`model.lora`, see `baton.models.lora`). `check()`: the
directory exists and holds a config.json (a ConfigError, one line, before a run writes
anything; the drivers' `open_run` calls it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from baton.models.lora import LoraSection

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ModelConfig:
    path: str = "checkpoints/arith-sft"  # a local HF directory (model + tokenizer)
    dtype: Literal["float32", "bfloat16"] = "float32"  # storage dtype of the weights
    lora: LoraSection | None = None  # train LoRA adapters only (the base stays frozen)

    def check(self, key: str = "model.path") -> None:
        from baton.config import ConfigError

        p = Path(self.path)
        if not p.is_dir():
            raise ConfigError(f"{key}={self.path}: no such directory (baton loads local HF checkpoints only; "
                              f"`baton make-tiny DIR` writes a tiny one)")
        if not (p / "config.json").is_file():
            hint = (": a LoRA adapter, not a model; give its base model, or merge it with `baton export --merge`"
                    if (p / "adapter_config.json").is_file() else "")
            raise ConfigError(f"{key}={self.path}: holds no config.json, so it is not a HF model directory{hint}")
        if self.lora is not None:
            self.lora.check()

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
