"""The algorithm families' registries (advantages, policy losses, KL estimators, loss
aggregations, ...) are `baton.registry.Registry`s; a new variant is one decorated function
in any module that is imported before the trainer looks the name up:

    @register_advantage("my_adv", inputs=("scores", "response_mask", "group_index"))
    def my_adv(*, scores, response_mask, ...): ...

Every entry that takes `algo.*` keys declares them where it is registered (`hyper=`: keyword ->
`algo.<key>`), so the driver passes them by name (`hyper_args`) and the config refuses a key
set with an entry that does not read it (`baton.algos.config.dependent_keys`, `key_readers`).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from baton.registry import Registry, UnknownName


def hyper_args(hyper: Mapping[str, str], algo: Any) -> dict[str, Any]:
    """The declared hyper-parameters' values in `algo` (an AlgoConfig), by keyword."""
    return {kw: getattr(algo, key) for kw, key in hyper.items()}


def key_readers(declared: Mapping[str, Iterable[str]], key: str) -> list[str]:
    """The entries of `declared` (name -> the `algo.*` keys it reads) that read `key`."""
    return [name for name, keys in declared.items() if key in keys]


__all__ = ["Registry", "UnknownName", "hyper_args", "key_readers"]
