"""Name -> thing registries, so variants are chosen by a config string, not by if/elif.

Every family of named things (engines, weight-sync transports, row sources, advantage
estimators, policy losses, KL estimators, algorithms, tasks, dispatch modes, ...) owns one
`Registry`. Registering a name twice is an error (a silent overwrite would change an
experiment without a trace), and looking up an unknown name lists the known ones:

    KL_ESTIMATORS = Registry("KL estimator")

    @KL_ESTIMATORS.register("my_kl")
    def my_kl(logprobs, ref_logprobs): ...

    ENGINES.lazy("vllm", "baton.rollout.vllm_engine:VLLMEngine")   # imported on first lookup

    KL_ESTIMATORS["my_kl"]     # the function
    KL_ESTIMATORS["my_lk"]     # UnknownName: unknown KL estimator 'my_lk'; known: [...]

(An advantage estimator also declares what it reads: `baton.algos.register_advantage`.)

A lazy entry is a "module:attr" string resolved (imported) the first time its name is looked
up, so an optional dependency is imported only by the run that chooses it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name that is not in a registry. A KeyError (a failed lookup) and a ValueError (a bad
    config value) both, so either `except` catches it; its text is the plain message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def resolve(path: str) -> Any:
    """The object "package.module:attr.sub" names, importing the module."""
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"{path!r} is not 'module:attr'")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Lazy:
    """A registry entry not imported yet."""
    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"<lazy {self.path}>"


class Registry(dict):
    """A dict of named things that refuses overwrites, whose missing-key error lists the
    known names, and whose lazy entries are imported on first lookup."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def add(self, name: str, value: T) -> T:
        """Register `value` as `name`; ValueError if the name is taken."""
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self[name] = value
        return value

    def lazy(self, name: str, path: str) -> None:
        """Register "module:attr" as `name`, imported the first time `name` is looked up."""
        self.add(name, Lazy(path))

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""
        def deco(value: T) -> T:
            return self.add(name, value)
        return deco

    def __getitem__(self, name: Any) -> Any:
        value = super().__getitem__(name)
        if isinstance(value, Lazy):
            value = resolve(value.path)
            dict.__setitem__(self, name, value)
        return value

    def get(self, name: Any, default: Any = None) -> Any:
        return self[name] if name in self else default

    def values(self) -> list[Any]:  # type: ignore[override]
        return [self[k] for k in self]

    def items(self) -> list[tuple[Any, Any]]:  # type: ignore[override]
        return [(k, self[k]) for k in self]

    def __missing__(self, name: Any):
        raise UnknownName(f"unknown {self.kind} {name!r}; known: {sorted(self)}")


__all__ = ["Lazy", "Registry", "UnknownName", "resolve"]
