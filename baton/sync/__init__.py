"""Weight-sync transports: move the trainer's weights into the rollout engines.

    inplace     colocated engine reads the trainer's module; only the version moves
    copy        in-process engine with its own weights (sharded trainer): full tensors copied in
    checkpoint  safetensors file written atomically, then reloaded (in process or over HTTP)
    broadcast   torch.distributed broadcast from trainer rank 0 into engine processes
"""

from baton.sync.base import WeightSync, check_logprob_parity, make_weight_sync
from baton.sync.broadcast import BroadcastSync, WeightReceiver
from baton.sync.checkpoint import CheckpointSync, iter_safetensors, save_safetensors_atomic
from baton.sync.copy import CopySync
from baton.sync.inplace import InplaceSync

__all__ = [
    "WeightSync", "check_logprob_parity", "make_weight_sync", "InplaceSync", "CopySync", "CheckpointSync",
    "BroadcastSync", "WeightReceiver", "save_safetensors_atomic", "iter_safetensors",
]
