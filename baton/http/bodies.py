"""Request bodies: `BodyLimit` (a 413 past a path's cap, by Content-Length or counted while it
streams) and `StrictJSONRoute` (JSON no client means is a 400 naming it; large bodies parsed
off the event loop)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Mapping

from fastapi import HTTPException, Request
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from baton.http.errors import send_error

OFF_LOOP_BYTES = 1 << 16  # bodies above this are parsed off the event loop
DEFAULT_MAX_BODY_BYTES = 4 * 2**20  # the OpenAI routes: text (a 128k-token conversation is < 1 MiB)


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Pure ASGI: 413 for a body past its path's cap (`limits[path]` = (bytes, the option that
    sets it), else `max_bytes` and `flag`), by Content-Length at once, else counted as it
    arrives (BodyTooLarge is raised into the reader; `install_guards`' handler answers 413)."""

    def __init__(self, app: ASGIApp, max_bytes: int, limits: Mapping[str, tuple[int, str]] | None = None,
                 flag: str = "--max-body-mb"):
        self.app, self.default, self.limits = app, (max_bytes, flag), dict(limits or {})

    @staticmethod
    def too_large(size: int | None, cap: int, flag: str) -> str:
        what = f"request body of {size} bytes" if size is not None else "request body"
        return f"{what} exceeds this server's limit of {cap} bytes ({cap / 2**20:g} MiB; {flag})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cap, flag = self.limits.get(scope.get("path", ""), self.default)
        declared = next((v for k, v in scope.get("headers") or [] if k.lower() == b"content-length"), b"")
        if declared.isdigit() and int(declared) > cap:
            await send_error(send, 413, self.too_large(int(declared), cap, flag), "body_too_large",
                              [(b"connection", b"close")])
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    raise BodyTooLarge(self.too_large(None, cap, flag))
            return message

        await self.app(scope, counted, send)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows a 64-bit float")
    return value


def check_json(body: bytes) -> Any:
    """The parsed body, or HTTPException(400) saying why it is not acceptable JSON."""
    try:
        data = json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError:
        return None  # FastAPI reports syntax errors itself (422 json_invalid, with the position)
    except UnicodeDecodeError as exc:
        raise HTTPException(400, f"request body is not valid UTF-8: {exc.reason}") from exc
    except RecursionError as exc:
        raise HTTPException(400, "request body is nested too deeply") from exc
    except ValueError as exc:  # our float hooks, or an integer past Python's digit limit
        raise HTTPException(400, f"invalid JSON value: {exc}") from exc
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            _check_text(x)
        elif isinstance(x, dict):
            for k, v in x.items():
                _check_text(k)
                stack.append(v)
        elif isinstance(x, list):
            stack.extend(x)
    return data


def _check_text(s: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise HTTPException(400, f"string contains a lone UTF-16 surrogate ({s[exc.start]!r} at "
                                     f"index {exc.start}); text must be valid Unicode") from exc


class StrictJSONRoute(APIRoute):
    """An APIRoute whose JSON bodies pass `check_json` before FastAPI parses them."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def strict_handler(request: Request):
            ctype = request.headers.get("content-type", "")
            if request.method in ("POST", "PUT", "PATCH") and (not ctype or "json" in ctype):
                body = await request.body()
                if len(body) > OFF_LOOP_BYTES:  # a big body is parsed on a thread: the loop keeps serving
                    data = await asyncio.to_thread(check_json, body)
                else:
                    data = check_json(body) if body else None
                if data is not None:
                    request._json = data  # Starlette's cache: FastAPI does not parse it again
            return await handler(request)

        return strict_handler
