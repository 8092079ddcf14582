"""`install_guards(app, ...)`: the route class, body cap, API key and error handlers every
baton HTTP app installs right after `FastAPI(...)`; `guarded_router()`: a router of routes
with that route class; `run_uvicorn` serves it on a socket and ends it on SIGTERM."""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from baton.http.auth import BearerAuth
from baton.http.bodies import BodyLimit, BodyTooLarge, StrictJSONRoute
from baton.http.errors import error_response, validation_message


def install_guards(app: FastAPI, *, api_key: str | None, max_body_bytes: int,
                   body_limits: Mapping[str, tuple[int, str]] | None = None, flag: str = "--max-body-mb") -> None:
    """Strict JSON, body caps, the API key and OpenAI-shaped errors on `app` (before routes)."""
    if api_key is not None and not api_key:
        raise ValueError("api_key must be a non-empty string (None: no authentication)")
    app.router.route_class = StrictJSONRoute  # NaN literals, lone surrogates ... -> 400
    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, limits=body_limits, flag=flag)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, exc.detail, getattr(exc, "param", None), getattr(exc, "code", None),
                              getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)  # never echoes the input (it may be NaN: unencodable)
        return error_response(422, message, param)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return error_response(413, str(exc), code="body_too_large", headers={"Connection": "close"})

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def guarded_router() -> APIRouter:
    """An APIRouter whose routes read JSON as `install_guards` makes the app's (strict JSON):
    what a route table split into routers builds its routes on (`app.include_router` keeps
    each route's class)."""
    return APIRouter(route_class=StrictJSONRoute)


def run_uvicorn(app: FastAPI, sock: Any, log_level: str = "warning", grace_s: float = 5.0) -> None:
    """Serve `app` on `sock` until SIGTERM / SIGINT; requests still running `grace_s` after
    the signal are cancelled, so the process exits promptly."""
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=grace_s)).run(sockets=[sock])


def _left_open(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loops' exception handler: an HTTP client an agent left open (the README's
    `openai.AsyncOpenAI(...)` without `async with`) is closed by its finalizer on whichever
    loop runs when the garbage collector finds it, often another session's, after its own loop
    has closed: that close fails with "Event loop is closed" (or is dropped unfinished). The
    client is gone either way; say nothing of it. Anything else goes to asyncio's handler."""
    task, error = context.get("task") or context.get("future"), context.get("exception")
    coro = getattr(task, "get_coro", lambda: None)()
    closing = getattr(coro, "__qualname__", "").endswith("aclose")
    if closing and (error is None or "Event loop is closed" in str(error)):
        return
    loop.default_exception_handler(context)


def quiet_clients_left_open(loop: Any = None) -> None:
    """Install `_left_open` as `loop`'s exception handler (the running loop by default): on
    every loop where an agent's clients may be finalized (the agents' own, the gateway's)."""
    (loop or asyncio.get_running_loop()).set_exception_handler(_left_open)
