"""Weight sync to a generator on its own pool through Ray's object store (`object_store`).

Driver side: `push(version)` hands the future of `WeightsWorker.full_weights()` (the actor's
weights, numpy on rank 0) straight into `GeneratorWorker.load_weights(...)`. On Ray the
tensors go actor -> object store -> generator, never through the driver, and the actor
returns as soon as its copy is stored: it never waits for the generator.
"""

from __future__ import annotations

from typing import Any



class ObjectStoreSync:
    def __init__(self, rollout: Any, *, weights: Any):
        self.rollout, self.weights = rollout, weights

    def push(self, version: int) -> list:
        return [self.rollout.submit("load_weights", self.weights.submit("full_weights"), version)]

    def close(self) -> None:
        pass
