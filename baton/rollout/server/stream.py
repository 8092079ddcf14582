"""`stream=True` for /v1/chat/completions and /v1/completions (and the gateway's chat):
server-sent events in the chunk shape the official `openai` client parses, sent as the
engine samples.

A sliced engine (`EmbeddedEngine`) reports each streamed generation's new tokens after
every slice (`Batcher.submit(on_progress=...)`: the first after the prefill and the first
token, then one a decode step); each row's new text goes out as a content (chat) or text
(completions) delta. Text that may still change is held back: the tail of the text that
begins a stop string (the final answer drops a stop string and all after it), an
incomplete UTF-8 character, and for a request with tools everything from the first
`<tool_call>` on (it becomes `tool_calls`, not content) and trailing whitespace (the
parsed content is stripped). When the generation ends the rest follows from the finished
response, exactly as the non-streamed answer has it: per choice the remaining content,
the tool_calls delta (each call whole: id, type, name, arguments), then a chunk with the
finish_reason. Logprobs (and top_logprobs) come whole with the last content chunk of
their choice, as they are computed from the finished completion. With
`stream_options.include_usage` a last chunk with empty `choices` carries the usage. Every
event is `data: {json}\\n\\n`; the stream ends with `data: [DONE]\\n\\n`. An engine that does
not slice (vLLM, a wrapped `generate`) streams the finished response this way.

A request the server refuses is refused with its 4xx before the stream starts
(`stream_response` waits for the first tokens or the answer); a failure after that is an
`{"error": {...}}` event, then [DONE].
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

from fastapi import HTTPException
from fastapi.responses import StreamingResponse

log = logging.getLogger("baton.serve")

TOOL_OPEN = "<tool_call>"


def _event(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` must wait: the longest tail that is a
    proper prefix of a stop string (a stop string may be completing)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


class TextDeltas:
    """One sample row's text as its tokens arrive, and the part of it that may be sent.

    Decoding is incremental (vLLM's detokenizer: a window of the last few tokens decoded
    with and without the new ones), so a long answer costs O(its length), and the text
    is the full decode's."""

    def __init__(self, tokenizer: Any, stops: list[str], tools: bool = False, hold_all: bool = False):
        self.tok, self.stops = tokenizer, [s for s in stops if s]
        self.tools, self.hold_all = tools, hold_all
        self.ids: list[int] = []
        self.text = ""  # decoded so far (without a trailing incomplete character)
        self.sent = ""  # sent so far: always a prefix of the final content
        self.stopped = False
        self._prefix = self._read = 0

    def push(self, new_ids: list[int], stopped: bool) -> str:
        """Add a slice's tokens; returns the text that may be sent now ("" if none)."""
        if self.stopped or self.tok is None:
            return ""
        self.ids += new_ids
        self.stopped = stopped
        if stopped:
            return ""  # the finished answer decides what is left (the stop string is cut there)
        before = self.tok.decode(self.ids[self._prefix:self._read], skip_special_tokens=True)
        after = self.tok.decode(self.ids[self._prefix:], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self.ids)
        return self._take(self._sendable())

    def _sendable(self) -> str:
        if self.hold_all:
            return ""
        text = self.text
        if self.tools:
            cut = text.find(TOOL_OPEN)
            text = text[:cut] if cut >= 0 else text[:len(text) - held_back(text, [TOOL_OPEN])]
            return text.rstrip()  # a call may follow: the parsed content is stripped then
        return text[:len(text) - held_back(text, self.stops)]

    def _take(self, sendable: str) -> str:
        if not sendable.startswith(self.sent) or len(sendable) <= len(self.sent):
            return ""
        delta = sendable[len(self.sent):]
        self.sent = sendable
        return delta

    def rest(self, final: str | None) -> str:
        """What is left to send of the answer's `final` text."""
        final = final or ""
        if not final.startswith(self.sent):  # the decoder disagreed with the full decode: never seen yet
            log.warning("stream: sent text %r is not a prefix of the answer %r", self.sent, final)
            return ""
        return final[len(self.sent):]


class _Progress:
    """The rows a generation's slices report (`Batcher.submit(on_progress=...)`), queued."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def __call__(self, rows: list[tuple[list[int], bool]]) -> None:
        self.queue.put_nowait(rows)


class ChatStream:
    """chat.completion.chunk events for one request."""

    obj, prefix = "chat.completion.chunk", "chatcmpl"

    def __init__(self, model: str, tokenizer: Any, stops: list[str], tools: bool = False, forced: bool = False,
                 include_usage: bool = False):
        self.head = {"id": f"{self.prefix}-{uuid.uuid4().hex}", "object": self.obj, "created": int(time.time()),
                     "model": model}
        self.make = lambda: TextDeltas(tokenizer, stops, tools=tools, hold_all=forced)
        self.rows: list[TextDeltas] = []
        self.include_usage = include_usage
        self._opened: set[int] = set()

    def _chunk(self, i: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> str:
        return _event({**self.head, "choices": [{"index": i, "delta": delta, "logprobs": logprobs,
                                                 "finish_reason": finish}]})

    def _open(self, i: int) -> Iterator[str]:
        if i not in self._opened:
            self._opened.add(i)
            yield self._chunk(i, {"role": "assistant", "content": ""})

    def progress(self, rows: list[tuple[list[int], bool]]) -> Iterator[str]:
        while len(self.rows) < len(rows):
            self.rows.append(self.make())
        for i, (ids, stopped) in enumerate(rows):
            yield from self._open(i)
            delta = self.rows[i].push(ids, stopped)
            if delta:
                yield self._chunk(i, {"content": delta})

    def final(self, resp: dict[str, Any]) -> Iterator[str]:
        """The rest of the finished chat.completion `resp`."""
        for ch in resp["choices"]:
            i, msg = ch["index"], ch["message"]
            yield from self._open(i)
            rest = self.rows[i].rest(msg.get("content")) if i < len(self.rows) else (msg.get("content") or "")
            if rest or ch.get("logprobs"):
                yield self._chunk(i, {"content": rest}, ch.get("logprobs"))
            if msg.get("tool_calls"):
                calls = [{"index": k, **c} for k, c in enumerate(msg["tool_calls"])]
                yield self._chunk(i, {"tool_calls": calls})
            yield self._chunk(i, {}, finish=ch["finish_reason"])
        if self.include_usage:
            yield _event({**self.head, "choices": [], "usage": resp["usage"]})


class CompletionStream(ChatStream):
    """text_completion chunk events for one request."""

    obj, prefix = "text_completion", "cmpl"

    def _chunk(self, i: int, text: str, logprobs: Any = None, finish: str | None = None) -> str:
        return _event({**self.head, "choices": [{"index": i, "text": text, "logprobs": logprobs,
                                                 "finish_reason": finish}]})

    def _open(self, i: int) -> Iterator[str]:
        return iter(())

    def progress(self, rows: list[tuple[list[int], bool]]) -> Iterator[str]:
        while len(self.rows) < len(rows):
            self.rows.append(self.make())
        for i, (ids, stopped) in enumerate(rows):
            delta = self.rows[i].push(ids, stopped)
            if delta:
                yield self._chunk(i, delta)

    def final(self, resp: dict[str, Any]) -> Iterator[str]:
        for ch in resp["choices"]:
            i = ch["index"]
            rest = self.rows[i].rest(ch["text"]) if i < len(self.rows) else ch["text"]
            yield self._chunk(i, rest, ch.get("logprobs"), ch["finish_reason"])
        if self.include_usage:
            yield _event({**self.head, "choices": [], "usage": resp["usage"]})


async def stream_response(run: Callable[[Callable], Awaitable[dict[str, Any]]], chunks: ChatStream) \
        -> StreamingResponse:
    """Starts `run(on_progress)` (the request's non-streamed handler, which reports its
    tokens to `on_progress` and returns the finished response) and streams `chunks` of it.
    Waits for the first tokens or the answer first, so a refused request is its 4xx."""
    progress = _Progress()
    task = asyncio.ensure_future(run(progress))
    task.add_done_callback(lambda _: progress.queue.put_nowait(None))  # None: the answer is ready
    try:
        head = await progress.queue.get()  # the first tokens, or the answer
    except BaseException:
        task.cancel()
        raise
    if head is None:
        task.result()  # a refused request raises its HTTPException here

    async def events() -> AsyncIterator[str]:
        rows = head
        try:
            while rows is not None:
                for e in chunks.progress(rows):
                    yield e
                rows = await progress.queue.get()
            try:
                resp = task.result()
            except HTTPException as exc:
                yield _event({"error": {"message": str(exc.detail), "type": "server_error", "param": None,
                                        "code": exc.status_code}})
            except Exception as exc:  # noqa: BLE001 - the stream has started: the error is an event
                yield _event({"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error",
                                        "param": None, "code": 500}})
            else:
                for e in chunks.final(resp):
                    yield e
            yield "data: [DONE]\n\n"
        finally:
            task.cancel()  # the client left mid-stream: its generation is withdrawn

    return sse(events())


def sse(chunks: AsyncIterator[str] | Iterator[str]) -> StreamingResponse:
    return StreamingResponse(chunks, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def include_usage(stream_options: dict[str, Any] | None) -> bool:
    return bool((stream_options or {}).get("include_usage"))
