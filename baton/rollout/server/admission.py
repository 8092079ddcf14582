"""Admission for `baton serve`: a bounded queue of requests waiting for generation.

A generation request (POST /generate, /v1/completions, /v1/chat/completions) is counted from
the moment it arrives (before its body is read) until it is answered. Those whose generation
has not started yet (arrived, minus the batcher's running requests) are the queue: past
`--max-queued-requests` of them a new one is answered at once with 429, `Retry-After` and an
OpenAI-shaped error (the `openai` client and `RemoteEngine` wait and retry), never parsed or
tokenized. /health and the other routes are never counted or refused: a probe is answered
however many requests wait.
"""

from __future__ import annotations

from typing import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from baton.http import send_error

GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
DEFAULT_MAX_QUEUED_REQUESTS = 256


class WaitQueue:
    """The count: generation requests arrived and not answered (`in_flight`), of which
    `running()` (the batcher's count) have started generating; the rest wait."""

    def __init__(self, max_queued: int, running: Callable[[], int], retry_after_s: int = 1):
        if max_queued < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {max_queued}")
        self.max_queued, self.running, self.retry_after_s = max_queued, running, retry_after_s
        self.in_flight = 0
        self.refused = 0  # requests answered 429

    def waiting(self) -> int:
        return max(0, self.in_flight - self.running())


class Admission:
    """ASGI middleware: 429 + Retry-After past `queue.max_queued` waiting generation requests."""

    def __init__(self, app: ASGIApp, queue: WaitQueue):
        self.app, self.queue = app, queue

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        q = self.queue
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        if q.waiting() >= q.max_queued:
            q.refused += 1
            await send_error(send, 429, f"server busy: {q.waiting()} requests are waiting for generation "
                                         f"(--max-queued-requests {q.max_queued}); retry after {q.retry_after_s} s",
                              "queue_full", [(b"retry-after", str(q.retry_after_s).encode())])
            return
        q.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            q.in_flight -= 1
