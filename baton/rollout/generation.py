"""`Generation`: one `EmbeddedEngine.generate` call run a slice of steps at a time
(`EmbeddedEngine.start_generation`), so `baton serve` can interleave a long request with
short ones, each getting the tokens it would get alone."""

from __future__ import annotations

from typing import Any

import torch

from baton.rollout.protocol import Completion


class Generation:
    """One `generate` call, run a slice of steps at a time: `advance(k)` runs up to k
    prefill / decode steps and returns True once it is done (`result` then holds the
    completions). Between slices the runner's state (KV cache, packed weights, positions)
    is put aside, so other generations (or `generate` calls) may run on the engine meanwhile:
    the steps are the same ones `generate` runs, in the same order, so the tokens are the
    same as when the call runs alone. Call it from one thread at a time (the engine is not
    thread safe); `close()` drops a generation that will not be finished."""

    def __init__(self, engine: Any, steps):  # an EmbeddedEngine (its module imports this one)
        self.engine, self._steps = engine, steps
        self._state: dict[str, Any] | None = None  # the runner's attributes while paused
        self.result: list[Completion] | None = None
        self.done = False
        self.steps = 0  # prefill and decode steps run so far

    def advance(self, max_steps: int | None = None) -> bool:
        if self.done:
            return True
        engine, runner = self.engine, self.engine.runner
        if self._state is not None:
            vars(runner).update(self._state)
        was_training = engine.model.training
        engine.model.eval()  # dropout off for the generic path
        paused, ran = False, 0
        try:
            with torch.inference_mode():
                while max_steps is None or ran < max_steps:
                    next(self._steps)
                    ran += 1
                self.steps += ran
                paused = True
        except StopIteration as stop:
            self.steps += ran
            self.result = stop.value
        finally:
            engine.model.train(was_training)
            self._state = {k: v for k, v in vars(runner).items() if k not in runner.SHARED} if paused else None
            self.done = not paused
            runner.release()
            if self.done:
                engine.generation_ended(self)
        return self.done

    def close(self) -> None:
        self._steps.close()
        if not self.done:
            self.engine.generation_ended(self)
        self._state, self.done = None, True
