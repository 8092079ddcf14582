"""HTTP plumbing of the trajectory API: JSON bodies read with
a cap on their plain and decompressed size (gzip), parsed into the request shapes with 422s
naming the field. Its bearer token is `baton.http.BearerAuth` (`detail=True`:
the 401 in FastAPI's {"detail": reason} shape, as every error here).

The body streams in on the event loop (`_read_body`); decoding it (`decode_json`) runs in a
worker thread, a JSON array one element at a time (`decode_json_array`), so that a 60 MB
/scored_data_list never holds the GIL for long: /health keeps answering meanwhile."""

from __future__ import annotations

import json
import re
import zlib
from typing import Any, Iterator

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

MAX_BODY_BYTES = 64 * 2**20  # plain and decompressed (--max-body-mb); a gzip bomb stops here, while streaming


def _json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


async def _read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body's bytes, gunzipped when `Content-Encoding: gzip` (Atropos envs gzip bodies
    of 1 KB or more); 413 past `limit` bytes (plain or decompressed: checked while the body
    streams in, so a gzip bomb never expands in memory), 400 for a bad gzip stream."""
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
    return b"".join(parts)


_WS = re.compile(r"[ \t\n\r]*")


def iter_json_array(text: str) -> Iterator[Any]:
    """The elements of the JSON array `text`, decoded one at a time (each call of the decoder
    holds the GIL only for its element; a consumer may drop each before the next). Raises
    ValueError where json.loads would, after yielding the elements before the fault."""
    dec = json.JSONDecoder()
    i = _WS.match(text, 0).end()
    if not text.startswith("[", i):
        raise json.JSONDecodeError("expected a JSON array", text, i)
    i = _WS.match(text, i + 1).end()
    if text.startswith("]", i):
        i += 1
    else:
        while True:
            item, i = dec.raw_decode(text, i)
            yield item
            i = _WS.match(text, i).end()
            if text.startswith(",", i):
                i = _WS.match(text, i + 1).end()
            elif text.startswith("]", i):
                i += 1
                break
            else:
                raise json.JSONDecodeError("expected ',' or ']'", text, i)
    if _WS.match(text, i).end() != len(text):
        raise json.JSONDecodeError("extra data", text, i)


def _bad_json(exc: BaseException) -> HTTPException:
    if isinstance(exc, RecursionError):
        return HTTPException(400, "body is not acceptable JSON: nested too deeply")
    return HTTPException(400, f"body is not valid JSON: {exc}")


def decode_json(raw: bytes, required: bool = True) -> Any:
    """The body as JSON (400 with the reason for a bad one)."""
    if not raw:
        if required:
            raise HTTPException(400, "empty body: expected JSON")
        return None
    try:
        return json.loads(raw)
    except (RecursionError, ValueError, UnicodeDecodeError) as exc:
        raise _bad_json(exc) from None


def decode_json_array(raw: bytes) -> Iterator[Any]:
    """The elements of a JSON array body, one at a time (`iter_json_array`); 400 as decode_json."""
    try:
        yield from iter_json_array(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (RecursionError, ValueError, UnicodeDecodeError) as exc:
        raise _bad_json(exc) from None


def _parse(model: type[BaseModel], data: Any, where: str = "body") -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise HTTPException(422, f"{where}: {loc or 'value'}: {first.get('msg')} "
                                 f"({exc.error_count()} error(s))") from None
