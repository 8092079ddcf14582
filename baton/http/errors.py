"""OpenAI-shaped errors for every HTTP service of baton: `{"error": {"message", "type", "param",
"code"}}` (the `openai` client shows `message`); `APIError` names the `param` / `code`;
`send_error` answers from a pure ASGI middleware; `check_model` is the 404 for a model not served."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import Send


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
               415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
               499: "client_closed_request", 503: "service_unavailable_error"}


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


async def send_json(send: Send, status: int, payload: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """A JSON answer from a pure ASGI middleware (before any route runs)."""
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, status: int, message: str, code: str | None,
                      headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """An error in OpenAI's shape, answered from a pure ASGI middleware."""
    await send_json(send, status, error_body(status, message, code=code), headers)


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
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


def check_model(name: Any, served: Sequence[str]) -> None:
    """404 for a `model` that is not one of `served` (None: the client did not say)."""
    if name is None or name in served:
        return
    raise APIError(404, f"model {name!r} is not served here; this server serves {', '.join(map(repr, served))} "
                        f"(GET /v1/models)", param="model", code="model_not_found")
