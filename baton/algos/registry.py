"""Name -> function registries, so variants are chosen by a config string, not by if/elif.

Each family (advantages, policy losses, KL estimators, loss aggregations) owns one
`Registry`; a new variant is one decorated function in any module that is imported
before the trainer looks the name up:

    @register_advantage("my_adv")
    def my_adv(*, scores, response_mask, ...): ...
"""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(dict):
    """A dict of named functions whose missing-key error lists the known names."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self:  # a silent overwrite would change an experiment without a trace
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self[name] = fn
            return fn
        return deco

    def __missing__(self, name: str):
        raise KeyError(f"unknown {self.kind} {name!r}; known: {sorted(self)}")
