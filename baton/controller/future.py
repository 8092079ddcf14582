"""Futures returned by `blocking=False` calls, and the argument splitting shared by backends.

A future may be passed as an argument of another group's call. The local backend simply
uses its value; the Ray backend hands the per-rank object refs on so the driver never
fetches the data (see `ray_backend.RayFuture`).
"""

from __future__ import annotations

from typing import Any, Callable

from baton.controller.dispatch import DispatchMode, Topology


class Future:
    """The result of a `blocking=False` call: `get(timeout=None)` and `done()`."""

    def get(self, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def done(self) -> bool:
        raise NotImplementedError


class LocalFuture(Future):
    """Already resolved: the local backend runs the call before returning the future. An
    exception is kept and raised by `get()`, as a remote one would be."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error

    def get(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def done(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"LocalFuture({'error' if self._error is not None else 'done'})"


def split_call(mode: DispatchMode, topo: Topology, args: tuple, kwargs: dict,
               resolve: Callable[[Future], list[Any]]) -> list[tuple[tuple, dict]]:
    """Per-rank (args, kwargs): every argument is split by the mode; a Future argument is
    turned into per-rank values by the backend's `resolve`."""

    def column(value: Any, what: str) -> list[Any]:
        col = resolve(value) if isinstance(value, Future) else mode.split(value, topo)
        if len(col) != topo.world_size:
            raise ValueError(f"dispatch mode {mode.name!r} split {what} into {len(col)} parts "
                             f"for {topo.world_size} ranks")
        return col

    a_cols = [column(a, f"argument {i}") for i, a in enumerate(args)]
    k_cols = {k: column(v, f"argument {k!r}") for k, v in kwargs.items()}
    return [(tuple(c[r] for c in a_cols), {k: c[r] for k, c in k_cols.items()})
            for r in range(topo.world_size)]
