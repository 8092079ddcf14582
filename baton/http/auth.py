"""`BearerAuth`: ASGI middleware, `Authorization: Bearer <key>` on every path but /health,
compared with `hmac.compare_digest`; a 401 before the body is read."""

from __future__ import annotations

import hmac
from typing import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from baton.http.errors import send_error, send_json

PUBLIC_PATHS = frozenset({"/health"})


class BearerAuth:
    """Pure ASGI (not BaseHTTPMiddleware): `receive` reaches the app untouched, so the
    server still sees a client disconnect while its request waits for the engine. A 401
    says why, in the OpenAI error shape, or (`detail=True`, the trajectory API's shape, which
    `baton.services.client` reads) as {"detail": reason}."""

    def __init__(self, app: ASGIApp, api_key: str, public: frozenset[str] = PUBLIC_PATHS, *,
                 detail: bool = False, realm: str = "baton"):
        self.app, self.public, self.detail, self.realm = app, public, detail, realm
        self._key = api_key.encode()

    def authorized(self, headers: Sequence[tuple[bytes, bytes]]) -> str | None:
        """None if the headers carry the key, else the reason they do not."""
        values = [v for k, v in headers if k.lower() == b"authorization"]
        if not values:
            return "missing 'Authorization: Bearer <api key>' header"
        scheme, _, token = values[0].strip().partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return "malformed Authorization header: expected 'Bearer <api key>'"
        if not hmac.compare_digest(token.strip(), self._key):
            return "invalid API key"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.public:
            await self.app(scope, receive, send)
            return
        reason = self.authorized(scope.get("headers") or [])
        if reason is None:
            await self.app(scope, receive, send)
            return
        challenge = [(b"www-authenticate", f'Bearer realm="{self.realm}"'.encode())]
        if self.detail:
            await send_json(send, 401, {"detail": reason}, challenge)
        else:
            await send_error(send, 401, reason, "invalid_api_key", challenge)
