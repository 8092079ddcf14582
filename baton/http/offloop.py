"""`OffLoop`: one daemon thread for work that must not stall the event loop (chat templates,
tokenizing a huge prompt), never joined at exit so a SIGTERM is not held up by it."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable


class OffLoop:
    """Runs functions one at a time on a daemon thread (the chat template and the tokenizer:
    one at a time keeps peak memory as when they ran on the loop, and HF tokenizers are not
    meant for concurrent calls). Daemon: interpreter exit never waits for a long call."""

    def __init__(self, name: str = "baton-tokenize"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            loop, future, fn = job
            if future.cancelled():
                continue
            try:
                result, error = fn(), None
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # its loop closed meanwhile (the server stopping): nobody awaits it
                pass

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, lambda: fn(*args, **kwargs)))
        return await future

    def close(self) -> None:
        self._jobs.put(None)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
