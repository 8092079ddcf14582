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

A transport is a class registered for the placements it serves, like engines and row
sources: the built-ins below by "module:Class", imported when first built; one of your own by

    add_transport("my_sync", ("colocated",), "my_sync:MySync")   # or the class itself
    @register_transport("my_sync", "colocated")                  # the decorator form

(docs/EXTENDING.md section 4). Every transport is built the same way, `cls(receivers,
**options)` (`build_transport`): `receivers` is what gets the weights (colocated and servers:
the list of engines, `push(named_params, version)`, the `WeightSync` protocol; generator: the
generator's worker group, with `weights=` the actor's `WeightsWorker` group, `push(version) ->
futures`); options are keywords of the transport's own (checkpoint: directory=; broadcast:
bucket_mb=, timeout_s=, device=).

`baton.sync.lora.LoraSync` (adapter-only sync into engines serving the adapter by name) is not
registered: no `rollout.weight_sync` can use it until the rollout samples with the adapter's
name (`SamplingParams(lora=)`); registered, the name would be accepted and fail at run time.
"""

from __future__ import annotations

from typing import Any, Callable

from baton.registry import Registry

PLACEMENTS = ("colocated", "generator", "servers")
AUTO = "auto"
TRANSPORTS = Registry("weight-sync transport")  # (name, placement) -> class ("module:Class" until built)


def _check_placements(name: str, placements: tuple[str, ...]) -> None:
    if not placements or any(p not in PLACEMENTS for p in placements):
        raise ValueError(f"transport {name!r}: placements must be among {PLACEMENTS}, got {placements}")


def add_transport(name: str, placements: tuple[str, ...], cls: Any) -> None:
    """Register `cls` (a class, or "module:Class" imported when first built) as transport
    `name` for each of `placements`."""
    _check_placements(name, placements)
    for p in placements:
        if dict.get(TRANSPORTS, (name, p)) is cls:  # a module imported twice registers the same class again
            continue
        if isinstance(cls, str):
            TRANSPORTS.lazy((name, p), cls)
        else:
            TRANSPORTS.add((name, p), cls)


for _name, _placements, _path in (("inplace", ("colocated",), "baton.sync.inplace:InplaceSync"),
                                  ("copy", ("colocated",), "baton.sync.copy:CopySync"),
                                  ("checkpoint", ("colocated", "servers"), "baton.sync.checkpoint:CheckpointSync"),
                                  ("broadcast", ("servers",), "baton.sync.broadcast:BroadcastSync"),
                                  ("broadcast", ("generator",), "baton.sync.broadcast:GeneratorBroadcast"),
                                  ("object_store", ("generator",), "baton.sync.object_store:ObjectStoreSync")):
    add_transport(_name, _placements, _path)


def register_transport(name: str, *placements: str) -> Callable[[Any], Any]:
    """Class decorator: `name` serves `placements` with this class (`add_transport`)."""
    _check_placements(name, placements)

    def deco(cls: Any) -> Any:
        add_transport(name, placements, cls)
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


def build_transport(name: str, placement: str, receivers: Any, **options: Any) -> Any:
    """The transport `name` (already resolved) for `placement`: `cls(receivers, **options)`
    (see the module docstring)."""
    if (name, placement) not in TRANSPORTS:
        raise ValueError(f"weight sync {name!r} is not one of {transport_names(placement)} for {placement}")
    return TRANSPORTS[(name, placement)](receivers, **options)
