"""The HTTP guards `baton serve` (`baton/rollout/server/`) and the OpenAI gateway
(`baton/services/gateway.py`) share: one module, so both refuse the same requests the same way.

  install_guards(app, api_key=..., max_body_bytes=..., body_limits={path: (bytes, flag)})
                    call right after `FastAPI(...)`, before any route is added: strict JSON
                    route class, the body cap, the API key, and OpenAI-shaped errors.
  error bodies      every error is `{"error": {"message", "type", "param", "code"}}` (OpenAI's
                    shape: the official `openai` client shows `message`); raise `APIError`
                    to name the `param` / `code`, any HTTPException works.
  BearerAuth        ASGI middleware: `Authorization: Bearer <key>` on every path but /health,
                    compared with `hmac.compare_digest`; 401 before the body is read.
  BodyLimit         ASGI middleware: a body past its path's cap is a 413, by Content-Length
                    before a byte is read, else counted while it streams (chunked), so a
                    100 MB body is never held in memory.
  StrictJSONRoute   route class: JSON that Python would parse but no client means (NaN /
                    Infinity literals, numbers overflowing to inf, lone UTF-16 surrogates,
                    over-long integers) is a 400 naming it; bodies above 64 KB are parsed
                    on a thread, so the event loop keeps serving.
  OffLoop           one daemon thread for chat-template rendering and tokenizing: a huge
                    prompt never stalls the loop (/health answers), and a SIGTERM is never
                    held up by it at exit (a daemon thread is not joined).
  check_model       404 (`model_not_found`) for a `model` the app does not serve.
  run_uvicorn       serve on a socket; SIGTERM closes it, in-flight requests get `grace_s`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import queue
import threading
from typing import Any, Callable, Mapping, Sequence

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

PUBLIC_PATHS = frozenset({"/health"})
OFF_LOOP_BYTES = 1 << 16  # bodies above this are parsed off the event loop
DEFAULT_MAX_BODY_BYTES = 4 * 2**20  # the OpenAI routes: text (a 128k-token conversation is < 1 MiB)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
               415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
               499: "client_closed_request", 503: "service_unavailable_error"}


# --- OpenAI-shaped errors ------------------------------------------------------------------
class APIError(HTTPException):
    """An HTTPException that names the request field (`param`) and a machine-readable `code`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(status, message, headers=headers)
        self.param, self.code = param, code


def error_body(status: int, message: Any, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`: the shape the `openai` client reads."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    text = message if isinstance(message, str) else json.dumps(message, default=str)
    return {"error": {"message": text, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: Any, param: str | None = None, code: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=dict(headers or {}))


async def _send_json(send: Send, status: int, payload: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """A JSON answer from a pure ASGI middleware (before any route runs)."""
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Send, status: int, message: str, code: str | None,
                      headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """An error in OpenAI's shape, answered from a pure ASGI middleware."""
    await _send_json(send, status, error_body(status, message, code=code), headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """(message, param) for a pydantic validation error: the first problem, by field."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":  # loc is ("body", character position)
        where = first.get("loc", ("", "?"))[-1]
        return f"request body is not valid JSON: {(first.get('ctx') or {}).get('error', 'syntax error')} at " \
               f"character {where}", None
    loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path")]
    param = ".".join(loc) or None
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{param or 'body'}: {first.get('msg', 'invalid')}{more}", param


# --- authentication ------------------------------------------------------------------------
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
            await _send_json(send, 401, {"detail": reason}, challenge)
        else:
            await _send_error(send, 401, reason, "invalid_api_key", challenge)


# --- body size -----------------------------------------------------------------------------
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
            await _send_error(send, 413, self.too_large(int(declared), cap, flag), "body_too_large",
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


# --- strict JSON ---------------------------------------------------------------------------
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


# --- model names ---------------------------------------------------------------------------
def check_model(name: Any, served: Sequence[str]) -> None:
    """404 for a `model` that is not one of `served` (None: the client did not say)."""
    if name is None or name in served:
        return
    raise APIError(404, f"model {name!r} is not served here; this server serves {', '.join(map(repr, served))} "
                        f"(GET /v1/models)", param="model", code="model_not_found")


# --- work off the event loop ---------------------------------------------------------------
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


# --- the app -------------------------------------------------------------------------------
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
        message, param = _validation_message(exc)  # never echoes the input (it may be NaN: unencodable)
        return error_response(422, message, param)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return error_response(413, str(exc), code="body_too_large", headers={"Connection": "close"})

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


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
