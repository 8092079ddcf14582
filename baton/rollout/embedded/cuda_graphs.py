"""A step function captured as a CUDA graph and replayed: the thin CUDA-only layer under
`baton.rollout.embedded.static_decode`.

The step must read and write only tensors whose shapes and addresses stay fixed between
calls (a graph replays the recorded kernels on the recorded addresses) and must not sync
with the host. The first call runs it eagerly on a side stream (the warm-up PyTorch asks
for: lazy cuBLAS / kernel initialisation happens outside the capture), returns that real
result, then records the graph; later calls replay it and return its output tensor, which
the next replay overwrites.

NOT RUN ON A CPU: CI has no GPU, so this file is exercised only by tests/gpu/
(test_engine_cuda.py: captured vs eager static decode, logprobs vs the trainer's) and by
`bench/engine_throughput.py --device cuda`. On a CPU the same step runs eagerly, and that
path is what tests/rollout/ check; tests/graph_replay.py stands in for this class there,
checking that each replay reads the storages its capture read and that no capture syncs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

# torch's own check that a graph's inputs outlive it (a freed one fails the replay), where
# this torch has it (2.13 does; the GPU machine's 2.11 may not): tests/gpu turn it on
HAS_LIVENESS_CHECK = "check_input_liveness" in inspect.signature(torch.cuda.graph).parameters


class GraphedStep:
    """fn() -> Tensor (or a tuple of them) on CUDA device `device`, captured on its first call
    (see the module docstring). Captured and replayed with `device` current, whichever device the caller's is."""

    check_liveness = False  # capture with torch's input liveness check (HAS_LIVENESS_CHECK): a debugging aid

    def __init__(self, fn: Callable[[], torch.Tensor], device: torch.device):
        self.fn, self.device = fn, device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None

    def __call__(self) -> torch.Tensor:
        with torch.cuda.device(self.device):
            if self.graph is not None:
                self.graph.replay()
                return self.out
            return self._warm_up_and_capture()

    def _warm_up_and_capture(self) -> torch.Tensor:
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(main)
        # under autocast (a trainer's parity check), casts must not come from autocast's
        # cache: the graph would keep reading a cached tensor after the cache is cleared
        no_cache = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                                  enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        with no_cache, torch.cuda.stream(side):
            out = self.fn()  # the warm-up is this step's real result
        main.wait_stream(side)
        for t in out if isinstance(out, tuple) else (out,):
            t.record_stream(main)  # allocated on the side stream, read on the main one
        graph = torch.cuda.CUDAGraph()
        # stream=side: a capture stream on this device (torch's default one is made once, on
        # whichever device captured first); thread_local: a server's other threads may touch
        # CUDA while this one captures
        check = {"check_input_liveness": True} if self.check_liveness and HAS_LIVENESS_CHECK else {}
        with no_cache, torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local", **check):
            self.out = self.fn()  # recorded, not run: the cache is written once, above
        self.graph = graph
        return out
