"""`baton serve --log-requests`: one log line per request on logger `baton.serve`:

    POST /generate 200 12+4 tokens 0.031 s

(method, path, status, prompt+completion tokens when the request generated, wall time).
Pure ASGI, so a client's disconnect still reaches the app. The line is logged before the
response's last body chunk is sent, so a client that has the response can find its line."""

from __future__ import annotations

import logging
import sys
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("baton.serve")


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever sys.stderr is when a line is logged."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def enable() -> None:
    """Send `baton.serve`'s lines to stderr at INFO (`--log-requests`): without a handler of
    its own the logger's INFO lines went nowhere (the root logger passes WARNING and up)."""
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(asctime)s baton.serve %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)


class RequestLog:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status, logged = time.monotonic(), [0], [False]

        def line() -> None:
            if not logged[0]:
                logged[0] = True
                tokens = (scope.get("state") or {}).get("baton_tokens")
                used = f" {tokens[0]}+{tokens[1]} tokens" if tokens else ""
                log.info("%s %s %d%s %.3f s", scope.get("method"), scope.get("path"), status[0] or 500, used,
                         time.monotonic() - t0)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                line()  # before the client can have the whole response: its line is already written
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            line()  # a request that ended without a last body (a disconnect, an error)
