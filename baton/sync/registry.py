"""Weight-sync transports by name: the one key `rollout.weight_sync` and the registry behind it.

Where the engines sit decides which transports can reach them (the "placement"):

    colocated   the rollout role in the actor's process(es): `inplace` (the engine reads the
                trainer's module), `copy` (the engine holds its own weights: sharded trainer,
                or an engine such as vLLM that cannot read a torch module)
    generator   a `GeneratorWorker` on a pool of its own: `object_store` (a Ray future of the
                actor's weights), `broadcast` (a torch.distributed group of actor rank 0 and
                the generator ranks)
    servers     `baton serve` / vLLM processes in `data.servers`: `broadcast`, `checkpoint`

`auto` (the default) picks: colocated -> inplace when the engine shares the trainer's module,
else copy; generator -> object_store; servers -> broadcast.

A transport is one file that registers itself here for the placements it serves:

    @register_transport("name", "servers")
    class MySync: ...

plus its import line in `baton/sync/__init__.py` (which is what registers it: importing
this module imports the package first, so every transport is registered before a lookup). The class's
constructor arguments depend on the placement: colocated and servers transports take the
engines (`push(named_params, version)`, the `WeightSync` protocol); generator transports take
the generator and weights worker groups (`push(version) -> futures`).
"""

from __future__ import annotations

from typing import Any, Callable

from baton.registry import Registry

PLACEMENTS = ("colocated", "generator", "servers")
AUTO = "auto"
TRANSPORTS = Registry("weight-sync transport")  # (name, placement) -> class


def register_transport(name: str, *placements: str) -> Callable[[Any], Any]:
    """Class decorator: `name` serves `placements` with this class."""
    bad = [p for p in placements if p not in PLACEMENTS]
    if bad or not placements:
        raise ValueError(f"register_transport({name!r}): placements must be among {PLACEMENTS}, got {placements}")

    def deco(cls: Any) -> Any:
        for p in placements:
            if TRANSPORTS.get((name, p)) is not cls:  # a module imported twice registers the same class again
                TRANSPORTS.add((name, p), cls)
        return cls
    return deco


def transport_names(placement: str | None = None) -> list[str]:
    """Registered names (for one placement, or all), sorted."""
    return sorted({n for n, p in TRANSPORTS if placement is None or p == placement})


def check_weight_sync_name(name: str) -> None:
    """The config-time check (no placement known yet): `auto` or a registered name."""
    names = transport_names()
    if name != AUTO and name not in names:
        raise ValueError(f"rollout.weight_sync={name!r} is not one of {[AUTO] + names}")


def resolve_weight_sync(name: str, placement: str, *, shares_module: bool = True) -> str:
    """The transport to use: `auto` resolved (see the module docstring), an explicit name
    checked against what `placement` allows (one clear line otherwise)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    if name == AUTO:
        return {"colocated": "inplace" if shares_module else "copy", "generator": "object_store",
                "servers": "broadcast"}[placement]
    allowed = transport_names(placement)
    if name not in allowed:
        where = {"colocated": "a rollout engine in the actor's process",
                 "generator": "a generator on a pool of its own", "servers": "servers in data.servers"}[placement]
        known = name in transport_names()
        raise ValueError(f"rollout.weight_sync={name!r} {'cannot reach' if known else 'is unknown for'} {where}: "
                         f"choose one of {[AUTO] + allowed}")
    if name == "inplace" and not shares_module:
        raise ValueError("rollout.weight_sync='inplace' needs an engine that reads the trainer's module "
                         "(the embedded engine, unsharded actor): use 'copy' or 'auto'")
    return name


def build_transport(name: str, placement: str, *args: Any, **kwargs: Any) -> Any:
    """An instance of the transport `name` (already resolved) for `placement`."""
    cls = TRANSPORTS.get((name, placement))
    if cls is None:
        raise ValueError(f"weight sync {name!r} is not one of {transport_names(placement)} for {placement}")
    return cls(*args, **kwargs)
