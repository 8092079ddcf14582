"""Every algorithm a recipe can name (`algorithm:` at its top), with its config class and
its driver: what `baton train RECIPE` runs. Imported lazily, so naming one loads only it.

    grpo, ppo    the PPO family (baton.trainers.ppo): one driver, the name sets the default
                 estimator (grpo -> grpo, ppo -> gae)
    online_dpo   generate -> score -> pair -> reference -> update (baton.trainers.online_dpo)
    dpo          offline DPO from a jsonl of pairs (baton.trainers.offline_dpo)
    sft          supervised warm start (baton.trainers.sft)
    rm           a Bradley-Terry reward model (baton.trainers.reward_model)

A recipe without `algorithm:` is a GRPO recipe (the demo's shape).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

DEFAULT = "grpo"
ALGORITHMS: dict[str, tuple[str, str]] = {  # name -> ("module:ConfigClass", "module:train")
    "grpo": ("baton.trainers.ppo_config:PPOConfig", "baton.trainers.ppo:train"),
    "ppo": ("baton.trainers.ppo_config:PPOConfig", "baton.trainers.ppo:train"),
    "online_dpo": ("baton.trainers.dpo_config:DPOConfig", "baton.trainers.online_dpo:train"),
    "dpo": ("baton.trainers.dpo_config:OfflineDPOConfig", "baton.trainers.offline_dpo:train"),
    "sft": ("baton.trainers.sft:SFTConfig", "baton.trainers.sft:run_sft"),
    "rm": ("baton.trainers.reward_model:RMConfig", "baton.trainers.reward_model:run_rm"),
}


def _load(spec: str) -> Any:
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def check_algorithm(name: str) -> None:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm={name!r} is not one of {sorted(ALGORITHMS)}")


def config_class(name: str) -> type:
    check_algorithm(name)
    return _load(ALGORITHMS[name][0])


def driver(name: str) -> Callable[[Any], dict[str, Any]]:
    check_algorithm(name)
    return _load(ALGORITHMS[name][1])
