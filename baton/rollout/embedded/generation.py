"""`Generation`: one `EmbeddedEngine.generate` call run a slice of steps at a time
(`EmbeddedEngine.start_generation`), so `baton serve` can interleave a long request with
short ones, each getting the tokens it would get alone."""

from __future__ import annotations

from typing import Any, Callable

import torch

from baton.protocol import Completion


class Generation:
    """One `generate` call, run a slice of steps at a time: `advance(k)` runs up to k
    prefill / decode steps and returns True once it is done (`result` then holds the
    completions). Between slices the runner's state (KV cache, packed weights, positions)
    is put aside, so other generations (or `generate` calls) may run on the engine meanwhile:
    the steps are the same ones `generate` runs, in the same order, so the tokens are the
    same as when the call runs alone. Call it from one thread at a time (the engine is not
    thread safe); `close()` drops a generation that will not be finished."""

    def __init__(self, engine: Any, steps, live: dict[str, Any] | None = None):  # an EmbeddedEngine
        self.engine, self._steps = engine, steps
        self._live = live  # the engine keeps it current (`EmbeddedEngine._steps`); read by `partial`
        self._rows: list[list] | None = None  # partial(): [token ids, stopped, ids given] per row
        self._read = (None, 0)  # partial(): (the group, its steps already read)
        self._state: dict[str, Any] | None = None  # the runner's attributes while paused
        self.result: list[Completion] | None = None
        self.done = False
        self.steps = 0  # prefill and decode steps run so far

    def advance(self, max_steps: int | None = None, on_step: Callable[[], None] | None = None) -> bool:
        """on_step: called after each step but the last (a stream reads `partial()` there)."""
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
                    if on_step is not None:
                        on_step()
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

    def partial(self) -> list[tuple[list[int], bool]]:
        """Between slices: every sample row's tokens new since the last call (prompt-major,
        n per prompt; a row's tokens end at its first stop) and whether it has stopped. Reads
        only the steps run since the last call (one host sync), so streaming a long
        generation costs O(its length)."""
        live = self._live or {}
        if "results" not in live:
            return []
        n = live["n"]
        if self._rows is None:
            self._rows = [[[], False, 0] for _ in range(len(live["results"]) * n)]  # ids, stopped, given
        rows = self._rows
        for i, comps in enumerate(live["results"]):  # groups already done
            for j, c in enumerate(comps):
                rows[i * n + j][:2] = [c.token_ids, c.finish_reason == "stop"]
        group, t, buffers = live.get("group"), live.get("t", 0), live.get("buffers")
        start = self._read[1] if self._read[0] is group else 0
        if group is not None and buffers is not None and t > start:
            out_tokens, hits = buffers  # [rows, max_new], [rows, max_new] | None
            new = out_tokens[:, start:t].tolist()
            if hits is not None:
                h = hits[:, start:t]
                stopped, first = h.any(-1).tolist(), h.int().argmax(-1).tolist()
            else:
                stopped, first = [False] * len(new), [0] * len(new)
            for r, toks in enumerate(new):
                row = rows[group[r // n] * n + r % n]
                if row[1]:
                    continue  # stopped earlier: what follows is not its text
                row[0].extend(toks[:first[r] + 1] if stopped[r] else toks)
                row[1] = stopped[r]
        self._read = (group, t)
        out = []
        for row in rows:
            out.append((row[0][row[2]:], row[1]))
            row[2] = len(row[0])
        return out

    def close(self) -> None:
        self._steps.close()
        if not self.done:
            self.engine.generation_ended(self)
        self._state, self.done = None, True
