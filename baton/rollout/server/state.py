"""Shared state of `baton serve`: `_Server` (engine, batcher, limits, health) and the
helpers every endpoint uses (request checks, tokenizing off the event loop, a generate
that withdraws the request when its client leaves). `app.py` builds the app on it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any, Sequence

from fastapi import HTTPException, Request

from baton.rollout.server.batcher import Batcher, EngineRunner
from baton.http import APIError, BearerAuth, OffLoop, check_model
from baton.rollout.engines import context_len
from baton.rollout.server.guards import WeightsAllowList
from baton.protocol import Completion, SamplingParams
from baton.sync.broadcast import WeightReceiver

DEFAULT_MAX_REQUEST_TOKENS = 65536
DEFAULT_WEDGED_AFTER_S = 300.0
DEFAULT_MAX_GENERATE_BODY_BYTES = 32 * 2**20  # /generate: token-id batches from a trainer (~8 bytes an id)


class _Disconnected(Exception):
    pass


class _Server:
    """Everything the endpoints share."""

    def __init__(self, engine, tokenizer, model_name: str, *, max_batch_wait_ms: float, max_batch_seqs: int,
                 default_max_tokens: int, model_path: str | None, api_key: str | None, admin: bool,
                 weights_dirs: Sequence[str | os.PathLike] | None, max_request_tokens: int,
                 max_model_len: int | None, wedged_after_s: float, slice_steps: int, max_running: int):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.model_path = model_path
        self.weights_path = model_path  # what the served weights were last loaded from
        self.default_max_tokens = default_max_tokens
        self.runner = EngineRunner(engine)
        self.tok_thread = OffLoop("baton-tokenize")
        self.batcher = Batcher(self.runner, max_wait_ms=max_batch_wait_ms, max_batch_seqs=max_batch_seqs,
                               slice_steps=slice_steps, max_running=max_running)
        self.receiver = WeightReceiver(engine)
        self.auth = BearerAuth(None, api_key) if api_key is not None else None
        self.admin = admin
        self.allow = WeightsAllowList(weights_dirs)
        self.max_request_tokens = max_request_tokens
        self.wedged_after_s = wedged_after_s
        self.asleep = False
        self.updating = 0  # weight updates in progress
        self.weights_lock = asyncio.Lock()
        self.lora_paths: dict[str, str] = {}  # served LoRA adapters: name -> the path it came from
        cfg = getattr(engine.model, "config", None)
        self.vocab_size = getattr(cfg, "vocab_size", None) or (len(tokenizer) if tokenizer is not None else None)
        self.context_len = context_len(engine, max_model_len)
        # the engine's KV budget (sized from free memory now, the weights loaded, if not fixed)
        self.kv_budget = None if engine.batch_budget is None else engine.batch_budget()[0]
        # the names a request's `model` may give: the served name, the model's path and dir name
        self.aliases = [model_name] + sorted({x for x in (model_path, model_path and Path(model_path).name)
                                              if x and x != model_name})

    # --- helpers -----------------------------------------------------------------------
    def need_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise HTTPException(400, "this server has no tokenizer: send token ids (/generate input_ids)")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.need_tokenizer()(text)["input_ids"])

    async def off_loop(self, fn, *args, **kwargs) -> Any:
        """`fn(*args, **kwargs)` on the one tokenizer thread: a huge prompt never stalls the
        event loop (/health, other requests), and prompts are tokenized one at a time (peak
        memory as when they ran on the loop)."""
        return await self.tok_thread.run(fn, *args, **kwargs)

    async def encode_async(self, texts: list[str]) -> list[list[int]]:
        self.need_tokenizer()
        return await self.off_loop(lambda: [self.encode(t) for t in texts])

    def check_model(self, name: Any) -> None:
        """404 for a `model` that is neither the served model (or an alias) nor a LoRA adapter."""
        adapters = self.engine.adapters
        if name is None or name in self.aliases or name in adapters:  # the common case: no list built
            return
        check_model(name, self.aliases + sorted(adapters))

    def default_tokens(self, prompts: list[list[int]]) -> int:
        """max_tokens for a client that gave none: the default, shortened to fit the context."""
        if self.context_len is None or not prompts:
            return self.default_max_tokens
        room = self.context_len - max(len(p) for p in prompts)
        return max(1, min(self.default_max_tokens, room))

    def check_request(self, prompts: list[list[int]], params: SamplingParams) -> None:
        """400 with a reason for anything the engine cannot or should not run."""
        if not prompts:
            raise HTTPException(400, "no prompts given")
        for i, p in enumerate(prompts):
            if not p:
                raise HTTPException(400, f"prompt {i} is empty")
            if self.vocab_size is not None and any(t < 0 or t >= self.vocab_size for t in p):
                raise HTTPException(400, f"prompt {i} has a token id outside [0, {self.vocab_size})")
        if self.vocab_size is not None and any(t < 0 or t >= self.vocab_size for t in params.stop_token_ids):
            raise HTTPException(400, f"stop_token_ids has an id outside [0, {self.vocab_size})")
        longest, max_new, n = max(len(p) for p in prompts), params.max_new_tokens, params.n
        if self.context_len is not None and longest + max_new > self.context_len:
            raise APIError(400, f"prompt ({longest} tokens) + max_tokens ({max_new}) = {longest + max_new} "
                                f"exceeds the model's context of {self.context_len} tokens",
                           code="context_length_exceeded")
        if max_new * n > self.max_request_tokens:
            raise HTTPException(400, f"max_tokens x n = {max_new} x {n} = {max_new * n} exceeds this server's "
                                     f"cap of {self.max_request_tokens} generated tokens per prompt "
                                     f"(--max-request-tokens)")
        if self.kv_budget is not None and n * (longest + max_new) > self.kv_budget:
            raise HTTPException(400, f"n x (prompt + max_tokens) = {n} x {longest + max_new} = "
                                     f"{n * (longest + max_new)} KV-cache tokens exceed this server's budget "
                                     f"of {self.kv_budget} (--max-batch-tokens / --memory-fraction)")

    def lora_for(self, name: Any) -> str | None:
        """The served adapter a request names (vLLM: `model`, SGLang: `lora_path`), else None
        (the base weights). A list (SGLang: one per prompt) must name one adapter."""
        if isinstance(name, list):
            names = set(name)
            if len(names) > 1:
                raise HTTPException(400, "lora_path: one adapter per request (got several)")
            name = names.pop() if names else None
        return name if isinstance(name, str) and name in self.engine.adapters else None

    def token_str(self, tid: int, as_ids: bool) -> str:
        if as_ids or self.tokenizer is None:
            return f"token_id:{tid}"
        return self.tokenizer.decode([tid])

    def text(self, c: Completion, stops: list[str]) -> str:
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        if c.finish_reason == "stop" and stops:  # OpenAI/SGLang: the stop string is not returned
            cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
            if cut >= 0:
                text = text[:cut]
        return text

    def asleep_error(self) -> HTTPException:
        return HTTPException(503, "the engine is asleep (/release_memory_occupation); "
                                  "call /resume_memory_occupation first")

    async def generate(self, request: Request, prompts: list[list[int]], params: SamplingParams,
                       on_progress: Any = None) -> list[Completion]:
        """Batched generate that gives up (and withdraws the request) if the client leaves.
        on_progress: a stream's listener for each slice's new tokens (`Batcher.submit`)."""
        self.check_request(prompts, params)
        if self.asleep:
            raise self.asleep_error()
        task = asyncio.ensure_future(self.batcher.submit(prompts, params, on_progress))
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this handler was cancelled (a stream whose client left): withdraw too
            task.cancel()
            raise
        finally:
            watcher.cancel()
        if task not in done:
            task.cancel()  # withdraws it; a running batch nobody else waits for is cancelled
            raise _Disconnected()
        try:
            comps = task.result()
            request.state.baton_tokens = (sum(map(len, prompts)), sum(len(c.token_ids) for c in comps))
            return comps
        except (ValueError, KeyError) as exc:
            raise HTTPException(400, f"generation failed: {exc}") from exc
        except Exception as exc:
            if self.asleep:
                raise self.asleep_error() from exc
            raise HTTPException(500, f"generation failed: {type(exc).__name__}: {exc}") from exc

    # --- state -------------------------------------------------------------------------
    def health(self) -> tuple[str, str | None]:
        """(status, reason): wedged > updating > sleeping > ok. Wedged: the running engine call
        has made no progress (no decode step) for --wedged-after-s; a call that steps is busy."""
        current, quiet = self.runner.current, self.runner.quiet_s()
        if current is not None and quiet is not None and quiet > self.wedged_after_s:
            running = time.monotonic() - current[1]
            return "wedged", (f"engine call {current[0]!r} has made no progress for {quiet:.0f} s (running "
                              f"{running:.0f} s; deadline {self.wedged_after_s:g} s)")
        if self.updating:
            return "updating", "a weight update is in progress"
        if self.asleep:
            return "sleeping", "the engine released its memory; /resume_memory_occupation wakes it"
        return "ok", None

    def busy(self) -> dict[str, Any] | None:
        """What the engine is doing (None: idle): the call, how long it (or the oldest running
        generation, which runs in slices) has run, its last step, the requests it serves."""
        current, quiet = self.runner.current, self.runner.quiet_s()
        oldest = self.batcher.oldest_start()
        if current is None and oldest is None:
            return None
        now = time.monotonic()
        since = min(x for x in (oldest, current and current[1]) if x is not None)
        last = quiet if quiet is not None else now - max(self.runner.last_beat, since)
        return {"call": current[0] if current is not None else "generate", "running_s": round(now - since, 3),
                "last_progress_s_ago": round(last, 3), "queued_requests": self.batcher.queued,
                "running_requests": self.batcher.running}

    def authorized(self, request: Request) -> bool:
        return self.auth is None or self.auth.authorized(request.scope.get("headers") or []) is None

    @contextlib.asynccontextmanager
    async def weight_update(self):
        """Serializes weight updates and shows them on /health as "updating"; running
        generations finish first and none starts meanwhile (no generation mixes versions)."""
        async with self.weights_lock:
            self.updating += 1
            try:
                async with self.batcher.paused():
                    yield
            finally:
                self.updating -= 1


async def _wait_disconnect(request: Request) -> None:
    # The body is already read, so the next ASGI message is the client going away.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.01)  # a server that replays body messages must not spin us
