"""Name -> thing registries, so variants are chosen by a config string, not by if/elif.

Every family of named things (advantages, policy losses, KL estimators, tasks, dispatch
modes, ...) owns one `Registry`. Registering a name twice is an error (a silent overwrite
would change an experiment without a trace), and looking up an unknown name lists the
known ones:

    ADVANTAGES = Registry("advantage estimator")

    @ADVANTAGES.register("my_adv")
    def my_adv(*, scores, response_mask, ...): ...

    ADVANTAGES["my_adv"]     # the function
    ADVANTAGES["my_avd"]     # UnknownName: unknown advantage estimator 'my_avd'; known: [...]
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name that is not in a registry. A KeyError (a failed lookup) and a ValueError (a bad
    config value) both, so either `except` catches it; its text is the plain message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(dict):
    """A dict of named things that refuses overwrites and whose missing-key error lists the
    known names."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def add(self, name: str, value: T) -> T:
        """Register `value` as `name`; ValueError if the name is taken."""
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self[name] = value
        return value

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""
        def deco(value: T) -> T:
            return self.add(name, value)
        return deco

    def __missing__(self, name: Any):
        raise UnknownName(f"unknown {self.kind} {name!r}; known: {sorted(self)}")


__all__ = ["Registry", "UnknownName"]
