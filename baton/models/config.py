"""The `model:` section of a recipe: which local HF directory a role loads, in which dtype,
and optionally LoRA adapters on it (`model.lora`, see `baton.models.lora`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from baton.models.lora import LoraSection

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}  # float64: exact numerics checks


@dataclass
class ModelConfig:
    path: str = "checkpoints/arith-sft"  # a local HF directory (model + tokenizer)
    dtype: Literal["float32", "bfloat16", "float64"] = "float32"  # storage dtype of the weights
    lora: LoraSection | None = None  # train LoRA adapters only (the base stays frozen)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
