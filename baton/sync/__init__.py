"""Weight-sync transports: move the trainer's weights into the rollout engines.

    inplace     colocated engine reads the trainer's module; only the version moves
    copy        in-process engine with its own weights (sharded trainer): full tensors copied in
    checkpoint  safetensors file written atomically, then reloaded (in process or over HTTP)
    broadcast   torch.distributed broadcast from trainer rank 0 into engine processes
    object_store  a Ray future of the actor's weights into a generator on its own pool

Chosen by name (`rollout.weight_sync`): `baton.sync.registry` registers each by "module:Class"
(imported when first built); adding one is its file plus one `add_transport` line
(docs/EXTENDING.md).
"""

from baton.sync.base import WeightSync, check_logprob_parity
from baton.sync.broadcast import BroadcastSync, GeneratorBroadcast, WeightReceiver
from baton.sync.checkpoint import CheckpointSync, iter_safetensors, save_safetensors_atomic
from baton.sync.copy import CopySync
from baton.sync.inplace import InplaceSync
from baton.sync.object_store import ObjectStoreSync
from baton.sync.registry import add_transport, build_transport, register_transport, resolve_weight_sync, transport_names

__all__ = [
    "WeightSync", "check_logprob_parity", "InplaceSync", "CopySync", "CheckpointSync", "ObjectStoreSync",
    "BroadcastSync", "GeneratorBroadcast", "WeightReceiver", "save_safetensors_atomic", "iter_safetensors",
    "add_transport", "build_transport", "register_transport", "resolve_weight_sync", "transport_names",
]
