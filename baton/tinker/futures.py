"""Tinker's futures: a call returns `{"request_id"}` at once, its work runs on the server's one
worker thread (in arrival order), and `/api/v1/retrieve_future` returns the result.

`retrieve` waits up to `poll_s` for an unfinished call (a long poll: the SDK asks again at
once on `try_again`, so an immediate answer would be a busy loop), then answers
`{"type": "try_again", ...}`. A finished call's result (or its error, `{"error", "category"}`,
which the SDK raises as `RequestFailedError`) stays retrievable until `keep` newer calls have
finished; an unknown id is a 404. A retried request (the same model and seq_id) gets the
future of the first.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable


class UserError(ValueError):
    """A request that cannot be served (reported as the SDK's user-error category)."""


class Futures:
    def __init__(self, poll_s: float = 20.0, keep: int = 4096):
        self.poll_s, self.keep = poll_s, keep
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baton-tinker")
        self.calls: OrderedDict[str, asyncio.Future] = OrderedDict()
        self.kinds: dict[str, str] = {}
        self.by_seq: OrderedDict[tuple[str, int], str] = OrderedDict()

    def submit(self, kind: str, fn: Callable[[], Any], seq: tuple[str, int] | None = None) -> str:
        """Queue `fn` on the worker; its request id. `seq` (model id, seq id): a repeat of a
        request already queued returns that request's id and queues nothing."""
        if seq is not None and seq in self.by_seq and self.by_seq[seq] in self.calls:
            return self.by_seq[seq]
        request_id = f"{kind}-{uuid.uuid4().hex[:16]}"
        self.calls[request_id] = asyncio.get_running_loop().run_in_executor(self.worker, fn)
        self.kinds[request_id] = kind
        if seq is not None:
            self.by_seq[seq] = request_id
            while len(self.by_seq) > self.keep:
                self.by_seq.popitem(last=False)
        self._forget()
        return request_id

    def _forget(self) -> None:
        while len(self.calls) > self.keep:
            oldest = next(iter(self.calls))
            if not self.calls[oldest].done():
                return
            self.calls.pop(oldest)
            self.kinds.pop(oldest, None)

    def known(self, request_id: str) -> bool:
        return request_id in self.calls

    async def retrieve(self, request_id: str) -> tuple[str, Any]:
        """("result", value) | ("error", (message, category)) | ("try_again", None)."""
        future = self.calls[request_id]
        try:
            value = await asyncio.wait_for(asyncio.shield(future), self.poll_s)
        except asyncio.TimeoutError:
            return "try_again", None
        except UserError as e:
            return "error", (str(e), "user")
        except Exception as e:  # noqa: BLE001 - handed to the client as the call's failure
            return "error", (f"{type(e).__name__}: {e}", "server")
        return "result", value

    def close(self) -> None:
        self.worker.shutdown(wait=False, cancel_futures=True)
