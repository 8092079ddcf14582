"""A Hugging Face hub id as `model.path` (`Qwen/Qwen2.5-0.5B-Instruct`): downloaded through
huggingface_hub into its cache (or found there) and replaced by the local snapshot directory
before the config is validated, so config.yaml and every worker read a local path. Without
network (or with HF_HUB_OFFLINE=1 and nothing cached) it is one line naming the exact
download command, before anything is written.

    path = resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", "model.path")  # ~/.cache/huggingface/...
"""

from __future__ import annotations

import re
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the hub spells repo ids
# what a causal LM needs from its repo (not the .bin / .pth / .gguf copies some repos carry)
PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def is_hub_id(path: str) -> bool:
    """`path` is an `owner/name` hub id and no such local path exists."""
    return isinstance(path, str) and bool(HUB_ID.match(path)) and not Path(path).exists()


def download_command(repo_id: str) -> str:
    return f"hf download {repo_id} --local-dir models/{repo_id.split('/')[1]}"


def resolve_model_path(path: str, key: str = "model.path") -> str:
    """The local directory of hub id `path` (cached, else downloaded); ConfigError (one line,
    with the download command) when it cannot be had."""
    from baton.config import ConfigError

    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(path, allow_patterns=PATTERNS, local_files_only=True)
    except Exception:  # not cached (any of the hub's lookup errors): download it
        pass
    try:
        return snapshot_download(path, allow_patterns=PATTERNS)
    except Exception as e:  # offline, no such repo, gated: the same advice
        local = f"models/{path.split('/')[1]}"
        raise ConfigError(f"{key}={path}: not a local directory, and the Hugging Face hub could not give it "
                          f"({type(e).__name__}); download it where there is network: `{download_command(path)}`, "
                          f"then {key}={local}") from None
