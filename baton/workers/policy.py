"""`Policy`: the actor's explicit handle to the policy it trains.

A colocated rollout engine receives this handle (module + tokenizer + version) instead of
reaching into the actor's attributes: the engine reads the module's parameters in place,
and `version` counts the optimizer-step rounds the module has taken (the policy version
every sampled row carries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Policy:
    module: torch.nn.Module
    tokenizer: Any
    version: int = 0
