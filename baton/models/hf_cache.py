"""The KV-cache argument of a Hugging Face forward, across transformers versions: `cache`
from 5.2x on (`past_key_values` is deprecated there, to go in 5.40, and warns at every call),
`past_key_values` before. Every caller that passes or reads a cache goes through these two,
so no run prints the FutureWarning and both versions baton is tested with work."""

from __future__ import annotations

import inspect
from typing import Any


def cache_kwarg(forward: Any) -> str:
    """The name under which `forward` (a module's forward, or the module) takes a KV cache."""
    params = inspect.signature(getattr(forward, "forward", forward)).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache a forward returned (`cache` or `past_key_values`; a plain namespace's `cache`)."""
    if not hasattr(out, "keys"):
        return out.cache
    return out["cache"] if "cache" in out else out.past_key_values
