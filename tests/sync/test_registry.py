"""The weight-sync registry: names, `auto`, placement checks, one-line errors naming the choices."""

from __future__ import annotations

import pytest

from baton.sync import CheckpointSync, CopySync, InplaceSync, ObjectStoreSync, build_transport, resolve_weight_sync
from baton.sync import registry
from baton.sync.registry import check_weight_sync_name, register_transport, transport_names


def test_names_per_placement():
    assert transport_names("colocated") == ["checkpoint", "copy", "inplace"]
    assert transport_names("generator") == ["broadcast", "object_store"]
    assert transport_names("servers") == ["broadcast", "checkpoint"]


def test_auto_resolves_by_placement():
    assert resolve_weight_sync("auto", "colocated") == "inplace"
    assert resolve_weight_sync("auto", "colocated", shares_module=False) == "copy"
    assert resolve_weight_sync("auto", "generator") == "object_store"
    assert resolve_weight_sync("auto", "servers") == "broadcast"
    assert resolve_weight_sync("checkpoint", "servers") == "checkpoint"


def test_errors_name_the_choices():
    with pytest.raises(ValueError, match=r"'carrier-pigeon' is not one of \['auto', 'broadcast', 'checkpoint'"):
        check_weight_sync_name("carrier-pigeon")
    with pytest.raises(ValueError, match=r"'object_store' cannot reach servers in data.servers: choose one of "
                                         r"\['auto', 'broadcast', 'checkpoint'\]"):
        resolve_weight_sync("object_store", "servers")
    with pytest.raises(ValueError, match=r"'inplace' cannot reach a generator"):
        resolve_weight_sync("inplace", "generator")
    with pytest.raises(ValueError, match="use 'copy' or 'auto'"):
        resolve_weight_sync("inplace", "colocated", shares_module=False)
    with pytest.raises(ValueError, match="placement must be one of"):
        resolve_weight_sync("auto", "moon")


def test_build_and_register():
    assert isinstance(build_transport("inplace", "colocated", []), InplaceSync)
    assert isinstance(build_transport("copy", "colocated", [object()]), CopySync)
    assert isinstance(build_transport("object_store", "generator", None, weights=None), ObjectStoreSync)
    assert isinstance(build_transport("checkpoint", "servers", []), CheckpointSync)

    @register_transport("pigeon_test", "servers")
    class Pigeon:  # a new transport: one class, one registration
        def __init__(self, engines):
            self.engines = engines
    try:
        assert "pigeon_test" in transport_names("servers") and "pigeon_test" not in transport_names("colocated")
        assert isinstance(build_transport("pigeon_test", "servers", []), Pigeon)
        with pytest.raises(ValueError, match="already registered"):
            register_transport("pigeon_test", "servers")(type("Other", (), {}))
    finally:
        registry.TRANSPORTS.pop(("pigeon_test", "servers"))
    with pytest.raises(ValueError, match="placements must be among"):
        register_transport("x", "attic")
