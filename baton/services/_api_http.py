"""HTTP plumbing of the trajectory API: JSON bodies read with
a cap on their plain and decompressed size (gzip), parsed into the request shapes with 422s
naming the field. Its bearer token is `baton.rollout._http_guards.BearerAuth` (`detail=True`:
the 401 in FastAPI's {"detail": reason} shape, as every error here)."""

from __future__ import annotations

import json
import zlib
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

MAX_BODY_BYTES = 64 * 2**20  # plain and decompressed (--max-body-mb); a gzip bomb stops here, while streaming


def _json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


async def _read_json(request: Request, required: bool = True, limit: int = MAX_BODY_BYTES) -> Any:
    """The body as JSON, gunzipped when `Content-Encoding: gzip` (Atropos envs gzip bodies
    of 1 KB or more); 413 past `limit` bytes (plain or decompressed: checked while the body
    streams in, so a gzip bomb never expands in memory), 400 with the reason for a bad body."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes exceeds {limit} bytes (--max-body-mb)")
    gz = "gzip" in request.headers.get("content-encoding", "").lower()
    d = zlib.decompressobj(16 + zlib.MAX_WBITS) if gz else None
    parts, size = [], 0
    try:
        async for chunk in request.stream():
            while chunk:
                if d is None:
                    out, chunk = chunk, b""
                else:
                    out = d.decompress(chunk, limit + 1 - size)
                    chunk = d.unconsumed_tail
                size += len(out)
                if size > limit:
                    what = "decompressed body" if gz else "body"
                    raise HTTPException(413, f"{what} exceeds {limit} bytes (--max-body-mb)")
                parts.append(out)
                if d is not None and not out and chunk:
                    break
    except zlib.error as exc:
        raise HTTPException(400, f"invalid gzip body: {exc}") from exc
    raw = b"".join(parts)
    if not raw:
        if required:
            raise HTTPException(400, "empty body: expected JSON")
        return None
    try:
        return json.loads(raw)
    except RecursionError:
        raise HTTPException(400, "body is not acceptable JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise HTTPException(400, f"body is not valid JSON: {exc}") from exc


def _parse(model: type[BaseModel], data: Any, where: str = "body") -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise HTTPException(422, f"{where}: {loc or 'value'}: {first.get('msg')} "
                                 f"({exc.error_count()} error(s))") from None
