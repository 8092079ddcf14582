"""`baton serve --log-requests`: one log line per request on logger `baton.serve`:

    POST /generate 200 12+4 tokens 0.031 s

(method, path, status, prompt+completion tokens when the request generated, wall time).
Pure ASGI, so a client's disconnect still reaches the app."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("baton.serve")


class RequestLog:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.monotonic(), [0]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            tokens = (scope.get("state") or {}).get("baton_tokens")
            used = f" {tokens[0]}+{tokens[1]} tokens" if tokens else ""
            log.info("%s %s %d%s %.3f s", scope.get("method"), scope.get("path"), status[0] or 500, used,
                     time.monotonic() - t0)
