"""The `model:` section of a recipe: which local HF directory a role loads, in which dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ModelConfig:
    path: str = "checkpoints/arith-sft"  # a local HF directory (model + tokenizer)
    dtype: Literal["float32", "bfloat16"] = "float32"  # storage dtype of the weights

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
