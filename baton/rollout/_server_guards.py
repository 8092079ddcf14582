"""What keeps `baton serve` from being misused: the API key, strict JSON, the weights
allow-list, and the checks a checkpoint passes before it replaces the served weights.

  BearerAuth        ASGI middleware: `Authorization: Bearer <key>` on every path but
                    /health, compared with `hmac.compare_digest`; 401 with a reason otherwise.
                    It runs before the body is read, so an unauthenticated client costs nothing.
  StrictJSONRoute   route class that rejects, with a 400 naming the problem, JSON that
                    Python's parser would accept but no client means: NaN / Infinity
                    literals, numbers that overflow to infinity, strings with lone UTF-16
                    surrogates (they cannot be tokenized or encoded), over-long integers.
  BodyLimit         ASGI middleware: a request body past `max_bytes` (declared or counted
                    while it streams) is a 413 before it is buffered whole.
  check_admin_request  admin endpoints take only `Content-Type: application/json` (415) and
                    no cross-site browser request (an `Origin` that is not this host, or
                    `Sec-Fetch-Site: cross-site`: 403): a web page the user opens can send a
                    form or text/plain POST to 127.0.0.1 without a CORS preflight, never a
                    JSON one, so with no API key nothing a page sends reaches the engine.
  WeightsAllowList  a weights path is resolved (symlinks, `..`) and must lie inside one of
                    the allowed directories (403 otherwise), and be .safetensors (400).
  open_checkpoint / check_checkpoint
                    every tensor of a checkpoint is read once and checked (known name, right
                    shape, finite values) before the engine installs any of it, so a bad file
                    is rejected whole and the old weights keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from fastapi import HTTPException, Request
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

PUBLIC_PATHS = frozenset({"/health"})
OFF_LOOP_BYTES = 1 << 16  # bodies above this are parsed off the event loop


# --- authentication ------------------------------------------------------------------------
class BearerAuth:
    """Pure ASGI (not BaseHTTPMiddleware): `receive` reaches the app untouched, so the
    server still sees a client disconnect while its request waits for the engine."""

    def __init__(self, app: ASGIApp, api_key: str, public: frozenset[str] = PUBLIC_PATHS):
        self.app, self.public = app, public
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
        body = json.dumps({"detail": reason}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b'Bearer realm="baton"')]})
        await send({"type": "http.response.body", "body": body})


# --- body size -----------------------------------------------------------------------------
class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Pure ASGI: 413 for a body past `max_bytes`, by Content-Length at once, else counted as
    it arrives (BodyTooLarge is raised into the reader; the app's handler answers 413)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((v for k, v in scope.get("headers") or [] if k.lower() == b"content-length"), b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            body = json.dumps({"detail": f"request body of {int(declared)} bytes exceeds this server's limit of "
                                         f"{self.max_bytes} bytes (--max-body-mb)"}).encode()
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(f"request body exceeds this server's limit of {self.max_bytes} bytes "
                                       f"(--max-body-mb)")
            return message

        await self.app(scope, counted, send)


# --- admin requests ------------------------------------------------------------------------
def check_admin_request(request: Request) -> None:
    """HTTPException 415 / 403 for an admin request a browser could have sent cross-site."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise HTTPException(415, f"admin endpoints take only 'Content-Type: application/json' (got "
                                 f"{ctype or 'none'!r}); send a JSON body, e.g. {{}}")
    if request.headers.get("sec-fetch-site", "").lower() == "cross-site":
        raise HTTPException(403, "cross-site browser requests may not call admin endpoints")
    origin = request.headers.get("origin")
    if origin is not None:
        host = request.headers.get("host", "")
        if origin.split("://", 1)[-1].rstrip("/") != host:
            raise HTTPException(403, f"Origin {origin!r} is not this server ({host!r}): browser requests from "
                                     f"other sites may not call admin endpoints")


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
                elif body:
                    data = check_json(body)
                    if data is not None:
                        request._json = data  # Starlette's cache: FastAPI does not parse it again
            return await handler(request)

        return strict_handler


# --- weights from disk ---------------------------------------------------------------------
class WeightsAllowList:
    """Directories weights may be loaded from; `None` allows any path (in-process servers
    whose owner decides, see `build_app`)."""

    def __init__(self, dirs: Sequence[str | os.PathLike] | None):
        self.dirs = None if dirs is None else [Path(d).resolve() for d in dirs]

    def describe(self) -> str:
        return "any directory" if self.dirs is None else ", ".join(map(str, self.dirs)) or "nowhere"

    def _inside(self, p: Path) -> bool:
        return self.dirs is None or any(p == d or p.is_relative_to(d) for d in self.dirs)

    def files(self, model_path: str) -> list[Path]:
        """The resolved .safetensors files `model_path` names (a file, or a directory of
        shards). HTTPException 403 outside the allow-list, 400 for anything else wrong."""
        if not model_path or "\x00" in model_path:
            raise HTTPException(400, "model_path must be a non-empty path")
        try:
            path = Path(model_path).resolve()  # symlinks and '..' resolved before the check
        except (OSError, RuntimeError) as exc:  # e.g. a symlink loop
            raise HTTPException(400, f"cannot resolve model_path: {exc}") from exc
        if not self._inside(path):
            raise HTTPException(403, f"model_path {model_path!r} resolves to {str(path)!r}, outside the directories "
                                     f"this server may load weights from ({self.describe()}; see --weights-dir)")
        if path.is_dir():
            files = sorted(f.resolve() for f in path.glob("*.safetensors"))
            if not files:
                raise HTTPException(400, f"no *.safetensors files in {str(path)!r}")
        elif path.is_file():
            files = [path]
        else:
            raise HTTPException(400, f"weights path not found: {model_path!r}")
        for f in files:
            if not self._inside(f):  # a shard that is a symlink out of the allowed tree
                raise HTTPException(403, f"{str(f)!r} lies outside the allowed weights directories")
            if f.suffix != ".safetensors" or not f.is_file():
                raise HTTPException(400, f"{str(f)!r} is not a .safetensors file (only safetensors are loaded)")
        return files


@contextlib.contextmanager
def open_checkpoint(files: Sequence[Path]) -> Iterator[list[Any]]:
    """safe_open handles for `files` (kept open: both passes read the same file contents,
    whatever happens to the paths meanwhile). HTTPException 400 if one is not safetensors."""
    from safetensors import safe_open

    with contextlib.ExitStack() as stack:
        handles = []
        for f in files:
            try:
                handles.append(stack.enter_context(safe_open(str(f), framework="pt", device="cpu")))
            except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: the file is the problem
                raise HTTPException(400, f"{str(f)!r} is not a readable safetensors file: {exc}") from exc
        yield handles


def iter_handles(handles: Sequence[Any]) -> Iterator[tuple[str, torch.Tensor]]:
    for fh in handles:
        for name in fh.keys():
            yield name, fh.get_tensor(name)


def param_shapes(engine) -> dict[str, tuple[int, ...]] | None:
    """name -> shape of what `engine.update_weights` accepts (None: not an nn.Module engine)."""
    model = getattr(engine, "model", None)
    if not isinstance(model, torch.nn.Module):
        return None
    table = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for n, t in model.state_dict(keep_vars=True).items():  # tied aliases, buffers
        table.setdefault(n, tuple(t.shape))
    return table


def check_checkpoint(handles: Sequence[Any], shapes: dict[str, tuple[int, ...]] | None) -> int:
    """Read every tensor once; ValueError naming the first unknown name, wrong shape or
    non-finite tensor. Returns the number of tensors."""
    from baton.rollout.engine import _WRAPPER_PREFIXES

    count = 0
    for name, t in iter_handles(handles):
        count += 1
        if shapes is not None:
            key = name
            if key not in shapes:
                for prefix in _WRAPPER_PREFIXES:
                    key = key.removeprefix(prefix)
            if key not in shapes:
                raise ValueError(f"unknown parameter {name!r}")
            if shapes[key] != tuple(t.shape):
                raise ValueError(f"{name!r} has shape {tuple(t.shape)} in the checkpoint, the model's is {shapes[key]}")
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{name!r} has {bad} non-finite values (NaN/Inf); checkpoint rejected")
    if count == 0:
        raise ValueError("the checkpoint holds no tensors")
    return count
