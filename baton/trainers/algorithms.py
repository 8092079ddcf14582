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


def load_recipe(name: str, recipe: str | None, overrides: list[str]) -> Any:
    """The algorithm's config from a recipe and dotted overrides, with `placement.auto: true`
    applied: the machine's choice of ranks, overlap and threads for whatever the recipe left
    unset (`baton.controller.auto_placement`), printed in one line; what it decided becomes
    explicit keys (and `placement.auto` false), so config.yaml and a resume hold the choice."""
    import dataclasses

    from baton.config import ConfigError, load_config, merge_recipe

    cls = config_class(name)
    merged = merge_recipe(recipe, overrides)
    if merged.get("placement") == "auto":
        merged["placement"] = {"auto": True}
    place = merged.get("placement")
    if isinstance(place, dict) and place.get("auto") is True and "placement" in {f.name for f in dataclasses.fields(cls)}:
        if name not in ("grpo", "ppo"):
            raise ConfigError(f"placement.auto=true chooses ranks and generation overlap for the PPO family (grpo, "
                              f"ppo); algorithm {name} places its roles as the recipe says: remove placement.auto")
        from baton.controller.auto_placement import choose, count_model_params, detect_machine, view_from_raw

        path = (merged.get("model") or {}).get("path")
        choice = choose(*detect_machine(), count_model_params(path) if path else 0, view_from_raw(merged))
        print(choice.line(), flush=True)
        merged = merge_recipe(None, [*choice.overrides(), "placement.auto=false"], data=merged)
    return load_config(cls, data=merged)
