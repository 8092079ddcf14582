"""The HTTP layer every baton service shares (`baton serve`, the OpenAI gateway, the trajectory
API): one set of guards, so all of them refuse the same requests the same way.

  install_guards(app, api_key=..., max_body_bytes=..., body_limits={path: (bytes, flag)})
                    call right after `FastAPI(...)`, before any route is added: strict JSON
                    route class, the body cap, the API key, and OpenAI-shaped errors (app.py)
  errors.py         every error is `{"error": {"message", "type", "param", "code"}}` (OpenAI's
                    shape); raise `APIError` to name the `param` / `code`; `send_error` from a
                    pure ASGI middleware; `check_model`: 404 for a model the app does not serve
  auth.py           `BearerAuth`: `Authorization: Bearer <key>` on every path but /health
  bodies.py         `BodyLimit` (413 past a path's cap, never holding a 100 MB body) and
                    `StrictJSONRoute` (NaN / Infinity literals, overflowing numbers, lone
                    surrogates: a 400 naming them; bodies above 64 KB parsed on a thread)
  offloop.py        `OffLoop`: one daemon thread for template rendering and tokenizing
  app.py            `run_uvicorn`: serve on a socket, SIGTERM closes it with a grace period

It imports no other part of baton (a bottom layer: tests/test_layers.py).
"""

from baton.http.app import guarded_router, install_guards, quiet_clients_left_open, run_uvicorn
from baton.http.auth import PUBLIC_PATHS, BearerAuth
from baton.http.bodies import DEFAULT_MAX_BODY_BYTES, BodyLimit, BodyTooLarge, StrictJSONRoute, check_json
from baton.http.errors import APIError, check_model, error_body, error_response, send_error, send_json
from baton.http.offloop import OffLoop

__all__ = ["guarded_router", "install_guards", "quiet_clients_left_open", "run_uvicorn", "PUBLIC_PATHS", "BearerAuth",
           "DEFAULT_MAX_BODY_BYTES", "BodyLimit", "BodyTooLarge", "StrictJSONRoute", "check_json", "APIError",
           "check_model", "error_body", "error_response", "send_error", "send_json", "OffLoop"]
