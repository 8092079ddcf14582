"""`stream=True` for /v1/chat/completions and /v1/completions: server-sent events in the
chunk shape the official `openai` client parses.

The engine generates a request's tokens in one batched call (no per-token callbacks), so a
stream is the finished response cut into OpenAI chunks: for chat, per choice a role delta,
a content delta, a tool_calls delta (each call whole: id, type, name, arguments), then a
chunk with the finish_reason; for completions, per choice a text chunk with its
finish_reason. With `stream_options.include_usage` a last chunk with empty `choices`
carries the usage. Every event is `data: {json}\\n\\n`; the stream ends with
`data: [DONE]\\n\\n`.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from fastapi.responses import StreamingResponse


def _event(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def chat_chunks(resp: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """A non-streamed chat.completion `resp` as chat.completion.chunk events."""
    head = {"id": resp["id"], "object": "chat.completion.chunk", "created": resp["created"], "model": resp["model"]}
    for ch in resp["choices"]:
        i, msg = ch["index"], ch["message"]
        yield _event({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                           "logprobs": None, "finish_reason": None}]})
        if msg.get("content"):
            yield _event({**head, "choices": [{"index": i, "delta": {"content": msg["content"]},
                                               "logprobs": ch.get("logprobs"), "finish_reason": None}]})
        if msg.get("tool_calls"):
            calls = [{"index": k, **c} for k, c in enumerate(msg["tool_calls"])]
            yield _event({**head, "choices": [{"index": i, "delta": {"tool_calls": calls}, "logprobs": None,
                                               "finish_reason": None}]})
        yield _event({**head, "choices": [{"index": i, "delta": {}, "logprobs": None,
                                           "finish_reason": ch["finish_reason"]}]})
    if include_usage:
        yield _event({**head, "choices": [], "usage": resp["usage"]})
    yield "data: [DONE]\n\n"


def completion_chunks(resp: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """A non-streamed text_completion `resp` as text_completion chunk events."""
    head = {"id": resp["id"], "object": "text_completion", "created": resp["created"], "model": resp["model"]}
    for ch in resp["choices"]:
        yield _event({**head, "choices": [{"index": ch["index"], "text": ch["text"], "logprobs": ch.get("logprobs"),
                                           "finish_reason": ch["finish_reason"]}]})
    if include_usage:
        yield _event({**head, "choices": [], "usage": resp["usage"]})
    yield "data: [DONE]\n\n"


def sse(chunks: Iterator[str]) -> StreamingResponse:
    return StreamingResponse(chunks, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def include_usage(stream_options: dict[str, Any] | None) -> bool:
    return bool((stream_options or {}).get("include_usage"))
