"""`baton serve MODEL_DIR`: an HTTP inference server over an `Engine` (FastAPI + uvicorn).

Endpoints (JSON bodies; malformed input -> 422 naming the field, impossible requests ->
400 with a reason in `detail`; never a 500 for anything a client sent):

  GET  /health                      {"status": "ok" | "sleeping" | "updating" | "wedged",
                                     "version": int, "model": str, "reason"?: str,
                                     "model_path"?, "weights_path"?: str}; 200 only when
                                    "ok", else 503 (load balancers notice), the body says
                                    why. "wedged": an engine call has run longer than
                                    --wedged-after-s. Paths only for authenticated callers.
  GET  /v1/models, /v1/models/{id}  OpenAI model list (the served name with its `aliases`:
                                    the model's path and dir name, and LoRA adapters); any
                                    other `model` in a request is a 404 listing these
  POST /v1/completions              OpenAI completions; `prompt` may be text or token ids
                                    (vLLM style); extras: top_k, min_p, stop_token_ids,
                                    ignore_eos, return_token_ids, return_tokens_as_token_ids
  POST /v1/chat/completions         OpenAI chat; the prompt is the tokenizer's chat template
                                    (with `tools`; tool calls parsed: _server_tools.py)
  stream=True on both /v1 routes:   server-sent events, OpenAI chunks (_server_stream.py)
  POST /generate                    token-in / token-out, SGLang's shape (below)
  GET  /get_model_info, /get_weight_version, /stats
Admin endpoints (off with --no-admin: 403):
  POST /update_weights_from_disk    {"model_path": file-or-dir of safetensors, "version"?: int}
                                    the path must resolve inside a --weights-dir (else 403);
                                    every tensor is checked (known name, shape, finite) before
                                    any is installed: a bad checkpoint -> 400, old weights stay
  POST /init_weights_update_group   {"master_address", "master_port", "rank_offset",
                                     "world_size", "group_name"?, "backend"?}: join the
                                    trainer's group (this server is rank `rank_offset`);
                                    409 while it has a trainer (a group, set up or joining)
  POST /update_weights_from_distributed  {"names", "dtypes", "shapes", "version"?,
                                     "group_name"?, "bucket_bytes"?}: receive a broadcast
  POST /destroy_weights_update_group, /release_memory_occupation (sleep),
       /resume_memory_occupation (wake)
  POST /load_lora_adapter           {"lora_name", "lora_path": a PEFT adapter dir inside a
       (/v1/load_lora_adapter)       --weights-dir}: serve it by name (vLLM / SGLang shape;
                                    every tensor checked first; replaces a same-named one)
  POST /unload_lora_adapter         {"lora_name"}
       (/v1/unload_lora_adapter)
LoRA adapters are selected per request as vLLM does (`"model": lora_name` in
/v1/completions and /v1/chat/completions) and as SGLang does (`"lora_path": lora_name` in
/generate); /v1/models lists them. An unknown `model` is a 404.
Weight endpoints answer {"success": true, "message": str, "version": int}, or
{"success": false, "message": str, "detail": str} with a 4xx.

Security and bounds (CLI flags; the same keyword arguments on `build_app`):
  --api-key KEY (or env BATON_API_KEY; prefer the env, argv is visible in `ps`)
        every endpoint but /health needs `Authorization: Bearer KEY` (as vLLM and SGLang:
        probes cannot send secrets); checked before the body is read, in constant time;
        401 with a reason otherwise.
  --weights-dir DIR (repeatable; default: the served model's directory only)
        where /update_weights_from_disk may read; paths are resolved (symlinks, '..') first.
  --admin / --no-admin (default: on when bound to a loopback address, off otherwise)
        the weight and sleep endpoints let a caller replace the model, make this process
        connect to any host:port (torch.distributed) or stop serving. On loopback only local
        processes - in practice the trainer that started the server, whose sync transports
        (`baton.sync`) call these endpoints - can reach them, so they stay on; a server
        listening on the network gets them only when asked with --admin (use an API key too).
  --max-request-tokens N (default 65536): max_tokens x n per prompt, else 400.
  --max-model-len N (default: the model's max_position_embeddings): prompt + max_tokens
        must fit, else 400. n x (prompt + max_tokens) must also fit --max-batch-tokens (the
        engine's KV-cache budget; one prompt's samples are never split), else 400.
  --wedged-after-s S (default 300): /health says "wedged" while an engine call makes no
        progress (no decode step) for longer; a call that steps is reported under "busy"
        (call, running_s, last_progress_s_ago, queued_requests) with status "ok".
  --max-body-mb M (default 32): larger bodies get 413 (declared or counted as they stream);
        big bodies are parsed and prompts tokenized off the event loop.
  Admin endpoints take only `Content-Type: application/json` (415) and refuse cross-site
        browser requests (`Origin` not this host: 403), so no web page can reach them.
  --log-requests: one log line per request (method, path, status, tokens, time).

/generate request:
    {"input_ids": [1, 2, 3] | [[1, 2], [3, 4, 5]],      # or "text": str | [str]
     "sampling_params": {"max_new_tokens": 128, "temperature": 1.0, "top_p": 1.0,
        "top_k": -1, "min_p": 0.0, "n": 1, "stop": str | [str], "stop_token_ids": [int],
        "ignore_eos": false, "seed" | "sampling_seed": int},
     "return_logprob": false}
/generate response: one object for a single prompt with n == 1, else a list of
len(prompts) * n objects, prompt-major (the n samples of prompt 0 first):
    {"text": str,                                       # decoded, stop trimmed
     "output_ids": [int],                               # generated ids, incl. a stop token
     "meta_info": {"id": str, "prompt_tokens": int, "completion_tokens": int,
        "finish_reason": {"type": "stop", "matched": int} | {"type": "length", "length": int},
        "weight_version": int,
        "output_token_logprobs": [[logprob, token_id, null], ...]}}   # if return_logprob
Logprobs follow `baton.rollout.protocol` (log_softmax(logits / T) of the chosen token);
OpenAI `top_logprobs` only ever hold the chosen token (the engine computes no others), so
`logprobs` / `top_logprobs` above 1 are a 400, as is `response_format`.
A temperature must be 0 (greedy) or >= 1e-5 (smaller ones overflow logits / T).

Concurrency: requests arriving together with identical sampling params share one
generation on the engine thread (see `_server_batcher.py`); generations take turns in
slices of --slice-steps decode steps (default 16; up to --max-running at once, each with
its own KV cache), so a short request never waits for a long one to end, and gets the
tokens it would get alone; a client that disconnects while queued is dropped without
delaying anyone, and a running generation whose clients have all gone is cancelled
between decode steps. Weight updates and sleep let running generations finish first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from concurrent.futures import ThreadPoolExecutor

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from baton.rollout._server_batcher import DEFAULT_MAX_RUNNING, DEFAULT_SLICE_STEPS, Batcher, EngineRunner
from baton.rollout._server_guards import (BearerAuth, BodyLimit, BodyTooLarge, StrictJSONRoute, WeightsAllowList,
                                          check_admin_request, check_checkpoint, iter_handles, open_checkpoint,
                                          param_shapes)
from baton.rollout._server_log import RequestLog
from baton.rollout._server_routes import add_generation_routes
from baton.rollout._server_schemas import (I64_MAX, DestroyWeightsUpdateGroupRequest, InitWeightsUpdateGroupRequest,
                                           LoadLoraAdapterRequest, UnloadLoraAdapterRequest,
                                           UpdateWeightsFromDiskRequest, UpdateWeightsFromDistributedRequest, errors)
from baton.rollout.protocol import Completion, SamplingParams
from baton.sync.broadcast import AlreadyHasTrainer, WeightReceiver, validate_specs

DEFAULT_MAX_REQUEST_TOKENS = 65536
DEFAULT_WEDGED_AFTER_S = 300.0
DEFAULT_MAX_BODY_BYTES = 32 * 2**20


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
        self.tok_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baton-tokenize")
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
        cfg = getattr(getattr(engine, "model", None), "config", None)
        self.vocab_size = getattr(cfg, "vocab_size", None) or (len(tokenizer) if tokenizer is not None else None)
        ctx = [x for x in (getattr(cfg, "max_position_embeddings", None), max_model_len) if isinstance(x, int)]
        self.context_len = min(ctx) if ctx else None
        self.kv_budget = getattr(engine, "max_batch_tokens", None)
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
        return await asyncio.get_running_loop().run_in_executor(self.tok_pool, lambda: fn(*args, **kwargs))

    async def encode_async(self, texts: list[str]) -> list[list[int]]:
        self.need_tokenizer()
        return await self.off_loop(lambda: [self.encode(t) for t in texts])

    def check_model(self, name: Any) -> None:
        """404 for a `model` that is neither the served model (or an alias) nor a LoRA adapter."""
        if name is None or name in self.aliases or name in getattr(self.engine, "adapters", {}):
            return
        served = self.aliases + sorted(getattr(self.engine, "adapters", {}))
        raise HTTPException(404, f"model {name!r} is not served here; this server serves {', '.join(map(repr, served))}"
                                 f" (GET /v1/models)")

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
            raise HTTPException(400, f"prompt ({longest} tokens) + max_tokens ({max_new}) = {longest + max_new} "
                                     f"exceeds the model's context of {self.context_len} tokens")
        if max_new * n > self.max_request_tokens:
            raise HTTPException(400, f"max_tokens x n = {max_new} x {n} = {max_new * n} exceeds this server's "
                                     f"cap of {self.max_request_tokens} generated tokens per prompt "
                                     f"(--max-request-tokens)")
        if self.kv_budget is not None and n * (longest + max_new) > self.kv_budget:
            raise HTTPException(400, f"n x (prompt + max_tokens) = {n} x {longest + max_new} = "
                                     f"{n * (longest + max_new)} KV-cache tokens exceed this server's budget "
                                     f"of {self.kv_budget} (--max-batch-tokens)")

    def lora_for(self, name: Any) -> str | None:
        """The served adapter a request names (vLLM: `model`, SGLang: `lora_path`), else None
        (the base weights). A list (SGLang: one per prompt) must name one adapter."""
        if isinstance(name, list):
            names = set(name)
            if len(names) > 1:
                raise HTTPException(400, "lora_path: one adapter per request (got several)")
            name = names.pop() if names else None
        return name if isinstance(name, str) and name in getattr(self.engine, "adapters", {}) else None

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

    async def generate(self, request: Request, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Batched generate that gives up (and withdraws the request) if the client leaves."""
        self.check_request(prompts, params)
        if self.asleep:
            raise self.asleep_error()
        task = asyncio.ensure_future(self.batcher.submit(prompts, params))
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
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


def _weights_version(req, current: int) -> int:
    if req.version is not None:
        return req.version
    if req.weight_version is not None:
        try:
            version = int(req.weight_version)
        except ValueError as exc:
            raise HTTPException(400, f"weight_version must be an integer here, got {req.weight_version!r}") from exc
        if not 0 <= version <= I64_MAX:
            raise HTTPException(400, f"weight_version must be in [0, 2**63), got {version}")
        return version
    return current + 1


def _fail(status: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message, "detail": message}, status_code=status)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_app(engine, tokenizer, model_name: str, *, max_batch_wait_ms: float = 2.0, max_batch_seqs: int = 256,
              default_max_tokens: int = 256, model_path: str | None = None, api_key: str | None = None,
              admin: bool = True, weights_dirs: Sequence[str | os.PathLike] | None = None,
              max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS, max_model_len: int | None = None,
              wedged_after_s: float = DEFAULT_WEDGED_AFTER_S, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              log_requests: bool = False, slice_steps: int = DEFAULT_SLICE_STEPS,
              max_running: int = DEFAULT_MAX_RUNNING) -> FastAPI:
    """The FastAPI app serving `engine`. `tokenizer` may be None (token-id endpoints only).

    The options are the CLI's (see the module docstring), with defaults for an app the
    caller builds in process and binds itself (`ServerThread` binds 127.0.0.1): `admin`
    is on; `weights_dirs=None` means the directory of `model_path` when that is given,
    else any directory (so the trainer's own servers load the files `baton.sync` writes to
    a temp dir). `serve_main` always passes an explicit allow-list."""
    if api_key is not None and not api_key:
        raise ValueError("api_key must be a non-empty string (None: no authentication)")
    if weights_dirs is None and model_path is not None:
        p = Path(model_path)
        weights_dirs = [p if p.is_dir() else p.parent]
    srv = _Server(engine, tokenizer, model_name, max_batch_wait_ms=max_batch_wait_ms, max_batch_seqs=max_batch_seqs,
                  default_max_tokens=default_max_tokens, model_path=model_path, api_key=api_key, admin=admin,
                  weights_dirs=weights_dirs, max_request_tokens=max_request_tokens, max_model_len=max_model_len,
                  wedged_after_s=wedged_after_s, slice_steps=slice_steps, max_running=max_running)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await srv.batcher.close()
        srv.receiver.close()
        srv.runner.close()
        srv.tok_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="baton serve", lifespan=lifespan)
    app.router.route_class = StrictJSONRoute  # NaN literals, lone surrogates ... -> 400
    app.state.baton = srv
    instance = os.environ.get("BATON_INSTANCE")
    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if log_requests:
        app.add_middleware(RequestLog)
    auth = (401,) if api_key is not None else ()

    async def require_admin(request: Request) -> None:
        if not srv.admin:
            raise HTTPException(403, "admin endpoints (weight updates, update groups, sleep/wake) are disabled on "
                                     "this server; start it with --admin to enable them")
        check_admin_request(request)  # JSON only, no cross-site browser request (CSRF)

    admin_route = {"dependencies": [Depends(require_admin)],
                   "responses": errors(400, *auth, 403, 415, weights=True)}

    @app.exception_handler(_Disconnected)
    async def _gone(request: Request, exc: _Disconnected) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=413, headers={"Connection": "close"})

    @app.get("/health", responses={503: {"description": "Not ok: sleeping, updating or wedged; "
                                                        "the body's `status` and `reason` say which"}})
    async def health(request: Request) -> JSONResponse:
        status, reason = srv.health()
        body: dict[str, Any] = {"status": status, "version": engine.version, "model": model_name}
        if instance:
            body["instance"] = instance  # `baton launch`'s nonce: it started this process
        if reason:
            body["reason"] = reason
        busy = srv.busy()
        if busy is not None:
            body["busy"] = busy
        if srv.authorized(request):  # paths are not for anonymous probes
            body["model_path"] = model_path
            body["weights_path"] = srv.weights_path
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/v1/models", responses=errors(*auth))
    async def models() -> dict:
        data = [{"id": model_name, "object": "model", "created": 0, "owned_by": "baton"}]
        data += [{"id": name, "object": "model", "created": 0, "owned_by": "baton", "parent": model_name,
                  "root": srv.lora_paths.get(name)} for name in sorted(getattr(engine, "adapters", {}))]
        data[0]["aliases"] = srv.aliases
        return {"object": "list", "data": data}

    @app.get("/v1/models/{model_id:path}", responses=errors(*auth, 404))
    async def model(model_id: str) -> dict:
        srv.check_model(model_id)
        listed = await models()
        return next((m for m in listed["data"] if m["id"] == model_id), listed["data"][0])

    @app.get("/get_model_info", responses=errors(*auth))
    async def model_info() -> dict:
        return {"model_path": model_path or model_name, "tokenizer_path": model_path, "is_generation": True}

    @app.get("/get_weight_version", responses=errors(*auth))
    async def weight_version() -> dict:
        return {"weight_version": engine.version}

    @app.get("/stats", responses=errors(*auth))
    async def stats() -> dict:
        return dict(srv.batcher.stats)

    add_generation_routes(app, srv, errors(400, *auth, 404, 413, 499, 503))  # /v1/completions, /v1/chat/completions, /generate

    @app.post("/update_weights_from_disk", **admin_route)
    async def update_from_disk(req: UpdateWeightsFromDiskRequest) -> Any:
        try:
            version = _weights_version(req, engine.version)
            files = srv.allow.files(req.model_path)
            async with srv.weight_update():
                with open_checkpoint(files) as handles:
                    # read and check everything off the engine thread (generation goes on), then install
                    await asyncio.to_thread(check_checkpoint, handles, param_shapes(engine))
                    await srv.runner.call(engine.update_weights, iter_handles(handles), version,
                                          label="update_weights_from_disk")
        except HTTPException as exc:
            return _fail(exc.status_code, f"update_weights_from_disk failed: {exc.detail}")
        except (KeyError, ValueError) as exc:
            return _fail(400, f"update_weights_from_disk failed: {exc}; still serving version {engine.version}")
        srv.weights_path = str(files[0]) if len(files) == 1 else str(files[0].parent)
        return {"success": True, "message": f"loaded {req.model_path}", "version": engine.version,
                "num_paused_requests": 0}

    @app.post("/init_weights_update_group", dependencies=admin_route["dependencies"],
              responses={**admin_route["responses"], **errors(409)})
    async def init_group(req: InitWeightsUpdateGroupRequest) -> Any:
        if req.rank_offset >= req.world_size:
            return _fail(400, f"rank_offset ({req.rank_offset}) must be below world_size ({req.world_size})")
        backend = req.backend
        if backend == "auto":
            device = getattr(engine, "device", None)
            backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
        try:
            # Not on the engine thread: joining waits for the trainer, generation goes on.
            await asyncio.to_thread(srv.receiver.init_weights_update_group, req.master_address, req.master_port,
                                    req.rank_offset, req.world_size, req.group_name, backend, req.timeout_s)
        except AlreadyHasTrainer as exc:  # a second trainer: told at once, by name
            return _fail(409, f"init_weights_update_group refused: {exc}")
        except Exception as exc:  # noqa: BLE001 - bad address, timeout ...
            return _fail(400, f"init_weights_update_group failed: {type(exc).__name__}: {exc}")
        return {"success": True, "message": f"joined {req.group_name!r} as rank {req.rank_offset} ({backend})"}

    @app.post("/update_weights_from_distributed", **admin_route)
    async def update_from_distributed(req: UpdateWeightsFromDistributedRequest) -> Any:
        try:
            version = _weights_version(req, engine.version)
        except HTTPException as exc:
            return _fail(exc.status_code, str(exc.detail))
        bucket_bytes = req.bucket_bytes or None
        if req.group_name not in srv.receiver.groups:
            return _fail(400, f"no weight update group {req.group_name!r}: call /init_weights_update_group first")
        try:
            validate_specs(req.names, req.dtypes, req.shapes)
            async with srv.weight_update():
                await srv.runner.call(srv.receiver.update_weights_from_distributed, req.names, req.dtypes,
                                      req.shapes, version, req.group_name, bucket_bytes,
                                      label="update_weights_from_distributed")
        except (KeyError, ValueError) as exc:
            return _fail(400, f"update_weights_from_distributed failed: {exc}")
        srv.weights_path = f"broadcast:{req.group_name}"
        return {"success": True, "message": f"received {len(req.names)} tensors", "version": engine.version}

    @app.post("/destroy_weights_update_group", **admin_route)
    async def destroy_group(req: DestroyWeightsUpdateGroupRequest) -> Any:
        try:
            srv.receiver.destroy_weights_update_group(req.group_name)
        except ValueError as exc:
            return _fail(400, str(exc))
        return {"success": True, "message": f"destroyed {req.group_name!r}"}

    @app.post("/load_lora_adapter", **admin_route)
    @app.post("/v1/load_lora_adapter", **admin_route, include_in_schema=False)
    async def load_lora(req: LoadLoraAdapterRequest) -> Any:
        if req.lora_name == model_name:
            return _fail(400, f"lora_name {req.lora_name!r} is the base model's name")
        try:
            files = srv.allow.files(req.lora_path)  # the adapter dir must lie inside --weights-dir
            from baton.models.lora import read_adapter

            adapter = await asyncio.to_thread(read_adapter, files[0].parent)
            async with srv.weight_update():
                nbytes = await srv.runner.call(engine.load_lora_adapter, req.lora_name, adapter,
                                               label="load_lora_adapter")
        except HTTPException as exc:
            return _fail(exc.status_code, f"load_lora_adapter failed: {exc.detail}")
        except (KeyError, ValueError, FileNotFoundError, AttributeError) as exc:
            return _fail(400, f"load_lora_adapter failed: {exc}")
        srv.lora_paths[req.lora_name] = req.lora_path
        return {"success": True, "message": f"LoRA adapter {req.lora_name!r} added ({nbytes} bytes)",
                "loaded_adapters": dict(srv.lora_paths)}

    @app.post("/unload_lora_adapter", **admin_route)
    @app.post("/v1/unload_lora_adapter", **admin_route, include_in_schema=False)
    async def unload_lora(req: UnloadLoraAdapterRequest) -> Any:
        try:
            await srv.runner.call(engine.unload_lora_adapter, req.lora_name, label="unload_lora_adapter")
        except (KeyError, AttributeError) as exc:
            return _fail(400, f"unload_lora_adapter failed: {exc}")
        srv.lora_paths.pop(req.lora_name, None)
        return {"success": True, "message": f"LoRA adapter {req.lora_name!r} removed",
                "loaded_adapters": dict(srv.lora_paths)}

    @app.post("/release_memory_occupation", **admin_route)
    async def release_memory() -> dict:
        async with srv.batcher.paused():  # running generations finish first
            await srv.runner.call(engine.sleep, label="sleep")
        srv.asleep = True
        return {"success": True, "message": "asleep"}

    @app.post("/resume_memory_occupation", **admin_route)
    async def resume_memory() -> dict:
        await srv.runner.call(engine.wake, label="wake")
        srv.asleep = False
        return {"success": True, "message": "awake"}

    return app


class ServerThread:
    """Run an app with uvicorn on a background thread (tests, benchmarks, notebooks).

    port=0 picks a free port; `url` is known once the constructor returns."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self._sock = socket.create_server((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                       name=f"baton-serve-{self.port}")
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> "ServerThread":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def parse_serve_args(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> argparse.Namespace:
    """`baton serve`'s options with the defaults resolved: api_key (flag, else
    $BATON_API_KEY, else None), admin (True/False), weights_dirs (resolved paths)."""
    ap = argparse.ArgumentParser(prog="baton serve", description="Serve a local HF checkpoint over HTTP.")
    ap.add_argument("model_dir", help="local Hugging Face checkpoint directory (model + tokenizer)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    ap.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (printed on stdout)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto")
    ap.add_argument("--model-name", default=None, help="name reported by /v1/models (default: dir name)")
    ap.add_argument("--max-batch-wait-ms", type=float, default=2.0,
                    help="how long an idle server waits for more requests to batch together")
    ap.add_argument("--max-batch-seqs", type=int, default=256, help="max sequences (prompts x n) per engine call")
    ap.add_argument("--slice-steps", type=int, default=DEFAULT_SLICE_STEPS,
                    help="decode steps a generation runs before the next one takes its turn (0: run each to its "
                         "end; default %(default)s)")
    ap.add_argument("--max-running", type=int, default=DEFAULT_MAX_RUNNING,
                    help="generations that take turns at once, each with its own KV cache (default %(default)s)")
    ap.add_argument("--max-batch-tokens", type=int, default=65536,
                    help="engine KV-cache budget per group; n x (prompt + max_tokens) must fit it")
    ap.add_argument("--default-max-tokens", type=int, default=256, help="chat max_tokens when the client gives none")
    ap.add_argument("--max-request-tokens", type=int, default=DEFAULT_MAX_REQUEST_TOKENS,
                    help="cap on max_tokens x n per prompt (default %(default)s)")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="context length, prompt + max_tokens (default: the model's max_position_embeddings)")
    ap.add_argument("--api-key", default=None,
                    help="require 'Authorization: Bearer KEY' on every endpoint but /health "
                         "(default: env BATON_API_KEY; unset: no authentication)")
    ap.add_argument("--weights-dir", action="append", default=None, metavar="DIR", dest="weight_dir_list",
                    help="directory /update_weights_from_disk may load from; repeatable "
                         "(default: MODEL_DIR only)")
    ap.add_argument("--admin", action=argparse.BooleanOptionalAction, default=None,
                    help="enable the weight-update and sleep/wake endpoints (default: on when --host is a "
                         "loopback address, off otherwise)")
    ap.add_argument("--wedged-after-s", type=float, default=DEFAULT_WEDGED_AFTER_S,
                    help="/health reports 'wedged' (503) while one engine call runs longer than this")
    ap.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20,
                    help="largest request body (413 beyond; default %(default)s)")
    ap.add_argument("--log-requests", action="store_true",
                    help="log one line per request (method, path, status, tokens, time) to stderr")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    if args.slice_steps < 0 or args.max_running < 1:
        ap.error(f"--slice-steps must be >= 0 and --max-running >= 1 (got {args.slice_steps}, {args.max_running})")
    environ = os.environ if environ is None else environ
    args.api_key = args.api_key or environ.get("BATON_API_KEY") or None
    args.admin = _is_loopback(args.host) if args.admin is None else args.admin
    args.model_dir = Path(args.model_dir).resolve()
    args.weights_dirs = [Path(d).resolve() for d in (args.weight_dir_list or [args.model_dir])]
    return args


def serve_main(argv: list[str] | None = None) -> None:
    """`baton serve MODEL_DIR [--host H] [--port P] [--api-key K] [--weights-dir D] ...`"""
    args = parse_serve_args(argv)
    api_key, admin, model_dir, weights_dirs = args.api_key, args.admin, args.model_dir, args.weights_dirs

    import torch

    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.engines import build_engine

    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model = load_model(str(model_dir), dtype=getattr(torch, args.dtype), device=device)
    tokenizer = load_tokenizer(str(model_dir))
    engine = build_engine("embedded", model, tokenizer, max_batch_tokens=args.max_batch_tokens)
    name = args.model_name or model_dir.name
    app = build_app(engine, tokenizer, name, max_batch_wait_ms=args.max_batch_wait_ms,
                    max_batch_seqs=args.max_batch_seqs, default_max_tokens=args.default_max_tokens,
                    model_path=str(model_dir), api_key=api_key, admin=admin, weights_dirs=weights_dirs,
                    max_request_tokens=args.max_request_tokens, max_model_len=args.max_model_len,
                    wedged_after_s=args.wedged_after_s, max_body_bytes=int(args.max_body_mb * 2**20),
                    log_requests=args.log_requests, slice_steps=args.slice_steps,
                    max_running=args.max_running)
    sock = socket.create_server((args.host, args.port))
    print(f"baton serve: {name} on http://{args.host}:{sock.getsockname()[1]} ({device}, {args.dtype})", flush=True)
    print(f"baton serve: api key {'required' if api_key else 'OFF (anyone who reaches the port may call it)'}; "
          f"admin endpoints {'on' if admin else 'off'}; weights from {', '.join(map(str, weights_dirs))}", flush=True)
    if admin and not api_key and not _is_loopback(args.host):
        print("baton serve: WARNING: admin endpoints are on for a network address without --api-key", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level))
    server.run(sockets=[sock])
