"""`baton serve`: baton's OpenAI-compatible HTTP inference server over an `Engine` (FastAPI +
uvicorn). Endpoints, options and request shapes: `app.py`'s docstring.

  app.py        the app (`build_app`: health, models, stats), `ServerThread`, the CLI
                (`parse_serve_args`, `serve_main`)
  state.py      shared state (`_Server`: engine, batcher, limits, health), request checks
  routes.py     generation endpoints: /v1/completions, /v1/chat/completions, /generate
  admin.py      admin endpoints: weight updates, the update group, LoRA, sleep / wake
  batcher.py    scheduling: requests become engine calls, generations take turns in slices
  admission.py  the bounded queue of waiting requests (429 + Retry-After past it)
  schemas.py    request bodies (pydantic) and the OpenAPI error responses
  guards.py     admin requests (JSON only, no cross-site) and checkpoint checks
  tools.py      OpenAI tool calling: chat templates with tools, Hermes tool-call parsing
  stream.py     `stream=True`: server-sent events in the `openai` client's chunk shape,
                token by token
  structured.py response_format / a forced tool_choice / regex as a grammar (constrained
                decoding)
  logprobs.py   OpenAI top-N logprobs from one teacher-forced forward pass
  log.py        `--log-requests`: one log line per request

The HTTP guards shared with the gateway (API key, body caps, strict JSON, OpenAI-shaped
errors) are in `baton/http/`. The names below come from `app.py`, imported
on first use, so the gateway's imports of `schemas`, `stream`, `tools` and `batcher` stay
light (no torch, no uvicorn; `structured` loads llguidance only to check a grammar).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServerThread", "build_app", "parse_serve_args", "serve_main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from baton.rollout.server import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
