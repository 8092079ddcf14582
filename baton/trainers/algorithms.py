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

from typing import Any, Callable

from baton.registry import Registry, resolve

DEFAULT = "grpo"
ALGORITHMS = Registry("algorithm")  # name -> ("module:ConfigClass", "module:train"), imported on use
ALGORITHMS.add("grpo", ("baton.trainers.ppo_config:PPOConfig", "baton.trainers.ppo:train"))
ALGORITHMS.add("ppo", ("baton.trainers.ppo_config:PPOConfig", "baton.trainers.ppo:train"))
ALGORITHMS.add("online_dpo", ("baton.trainers.dpo_config:DPOConfig", "baton.trainers.online_dpo:train"))
ALGORITHMS.add("dpo", ("baton.trainers.dpo_config:OfflineDPOConfig", "baton.trainers.offline_dpo:train"))
ALGORITHMS.add("sft", ("baton.trainers.sft:SFTConfig", "baton.trainers.sft:run_sft"))
ALGORITHMS.add("rm", ("baton.trainers.reward_model:RMConfig", "baton.trainers.reward_model:run_rm"))


def check_algorithm(name: str) -> None:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm={name!r} is not one of {sorted(ALGORITHMS)}")


def config_class(name: str) -> type:
    check_algorithm(name)
    return resolve(ALGORITHMS[name][0])


def driver(name: str) -> Callable[[Any], dict[str, Any]]:
    check_algorithm(name)
    return resolve(ALGORITHMS[name][1])


AUTO_FAMILY = ("grpo", "ppo")  # algorithms whose placement `placement.auto` chooses
AUTO_ENV = "BATON_PLACEMENT_AUTO"  # "0": placement.auto is off unless a recipe sets it (the test suite)


def load_recipe(name: str, recipe: str | None, overrides: list[str], say: Any = None,
                data: dict[str, Any] | None = None) -> Any:
    """The algorithm's config from a recipe and dotted overrides, placed: a generator ahead on
    a pool of its own (`baton.trainers.placement.generator`, load_config's step for the PPO
    family: `baton.config.LOAD_STEPS`), and `placement.auto`
    applied: the machine's choice of devices, ranks and threads for whatever the recipe left
    unset (`baton.trainers.placement.auto`), printed in one line; what it decided becomes
    explicit keys (and `placement.auto` false), so config.yaml and a resume hold the choice.
    Auto never changes `trainer.mode` or anything else the update computes.

    The config is validated first, as the recipe gives it (placement.auto off): a wrong type,
    an unknown key, a missing model dir or user module is one ConfigError before anything
    (placement included) reads it; placement reads the validated config, not the raw mapping.

    For the PPO family auto is on unless the recipe or an override sets `placement.auto`
    (or the environment sets BATON_PLACEMENT_AUTO=0). A resumed run (trainer.resume set, the
    run dir's config.yaml present) keeps the placement and trainer.mode that config.yaml holds
    instead of choosing again. `say` is where the line goes (a text stream; stdout by default:
    `baton config` sends it to stderr). `data`: sections (a mapping, as a recipe file holds
    them) over the recipe file's, before the overrides (`baton.train` with a dict)."""
    import dataclasses
    import os
    import sys

    say = say or sys.stdout

    from baton.config import ConfigError, load_config, merge_recipe
    from baton.models.resolve import resolve_model_paths

    cls = config_class(name)
    # a hub id or a .gguf file: a local HF directory (baton.models.resolve)
    merged = resolve_model_paths(merge_recipe(recipe, overrides, data))
    if merged.get("placement") == "auto":
        merged["placement"] = {"auto": True}
    has_placement = "placement" in {f.name for f in dataclasses.fields(cls)}
    place = merged.get("placement")
    if (name in AUTO_FAMILY and has_placement and os.environ.get(AUTO_ENV, "1") != "0"
            and (place is None or (isinstance(place, dict) and "auto" not in place))):
        merged["placement"] = place = {**(place or {}), "auto": True}
    if not (isinstance(place, dict) and place.get("auto") is True and has_placement):
        return load_config(cls, data=merged)
    if name not in AUTO_FAMILY:
        raise ConfigError(f"placement.auto=true chooses devices and ranks for the PPO family (grpo, ppo); "
                          f"algorithm {name} places its roles as the recipe says: remove placement.auto")
    as_given = merge_recipe(None, ["placement.auto=false"], data=merged)
    cfg = load_config(cls, data=as_given)  # validated before placement reads anything
    kept = _saved_placement(cfg, merged)
    if kept is not None:
        print(f"placement auto: kept from the resumed run's config.yaml: {' '.join(kept)}", file=say, flush=True)
        return load_config(cls, data=merge_recipe(None, kept, data=as_given))
    from baton.trainers.session.run import check_inputs

    check_inputs(cfg)  # the model dir exists before its size is read
    from baton.trainers.placement.auto import (choose, count_model_params, detect_idle_cores, detect_machine,
                                                 detect_memory, view_from_config)

    view = view_from_config(cfg, explicit_keys(merged))
    choice = choose(*detect_machine(), count_model_params(cfg.model.path), view, memory_bytes=detect_memory(),
                    idle_cores=detect_idle_cores())
    print(choice.line(), file=say, flush=True)
    if not choice.overrides():  # every key was set: the config validated above is the placed one
        return cfg
    return load_config(cls, data=merge_recipe(None, choice.overrides(), data=as_given))


def explicit_keys(merged: dict[str, Any]) -> set[str]:
    """The `section.key` names a recipe mapping (with its overrides) sets."""
    return {f"{section}.{key}" for section, body in merged.items() if isinstance(body, dict) for key in body}


def _resume_keys() -> tuple[str, ...]:
    """What a resumed run keeps from its config.yaml: what auto decided, and the run's mode."""
    from baton.trainers.placement.auto import AUTO_KEYS

    return (*AUTO_KEYS, "trainer.mode")


def _saved_placement(cfg: Any, merged: dict[str, Any]) -> list[str] | None:
    """Overrides restoring the keys auto decides from the run dir's config.yaml, for a
    resumed run of the validated `cfg` (None: not resuming, or no config.yaml yet). Keys the
    recipe (`merged`) sets win."""
    from pathlib import Path

    from baton.runs.fsutil import read_yaml
    from baton.runs.rundir import TORN_CONFIG

    if not cfg.trainer.resume or not cfg.trainer.run_dir:
        return None
    saved_path = Path(cfg.trainer.run_dir) / "config.yaml"
    if not saved_path.is_file():
        return None
    saved = read_yaml(saved_path, TORN_CONFIG) or {}
    given, out = explicit_keys(merged), []
    for key in _resume_keys():
        section, field = key.split(".")
        if key in given or field not in (saved.get(section) or {}):
            continue
        out.append(f"{key}={saved[section][field]}")
    return out
