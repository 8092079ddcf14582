"""`baton serve MODEL_DIR`: an HTTP inference server over an `Engine` (FastAPI + uvicorn).

Endpoints (JSON bodies; malformed input -> 422 naming the field, impossible requests ->
400 with the reason; never a 500 for anything a client sent). Every error is OpenAI's
`{"error": {"message", "type", "param", "code"}}` (the `openai` client shows `message`):

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
                                    (with `tools`; tool calls parsed: tools.py)
  stream=True on both /v1 routes:   server-sent events, OpenAI chunks, token by token
                                    (stream.py); stream_options.include_usage
  POST /generate                    token-in / token-out, SGLang's shape (below)
  GET  /get_model_info, /get_weight_version, /stats
Admin endpoints (off with --no-admin: 403):
  POST /update_weights_from_disk    {"model_path": file-or-dir of safetensors, "version"?: int,
                                    "digests"?: {tensor: digest} (baton.sync.digest: checked
                                    first; a mismatch is a 409 naming the tensor, old version kept)}
                                    the path must resolve inside a --weights-dir (else 403);
                                    every tensor is checked (known name, shape, finite) before
                                    any is installed: a bad checkpoint -> 400, old weights stay
  POST /init_weights_update_group   {"master_address", "master_port", "rank_offset",
                                     "world_size", "group_name"?, "backend"?}: join the
                                    trainer's group (this server is rank `rank_offset`);
                                    409 while it has a trainer (a group, set up or joining)
  POST /update_weights_from_distributed  {"names", "dtypes", "shapes", "version"?,
                                     "group_name"?, "bucket_bytes"?, "digests"?}: receive a
                                    broadcast (digests: every tensor checked before any is
                                    installed; a mismatch is a 409 naming it, old version kept)
  POST /destroy_weights_update_group, /release_memory_occupation (sleep),
       /resume_memory_occupation (wake)
  POST /weights_digest              {"digests"?: bool}: {"weight_version", "dtypes": {tensor:
                                    dtype}, "digests": {tensor: digest}} of what the model holds
                                    now, hashed here (a trainer's `sync/verified`); 409 asleep
  POST /load_lora_adapter           {"lora_name", "lora_path": a PEFT adapter dir inside a
       (/v1/load_lora_adapter)       --weights-dir, "digests"?}: serve it by name (vLLM / SGLang
                                    shape; every tensor checked first, against the digests
                                    when given: 409 naming it; replaces a same-named one)
  POST /unload_lora_adapter         {"lora_name"}
       (/v1/unload_lora_adapter)
LoRA adapters are selected per request as vLLM does (`"model": lora_name` in
/v1/completions and /v1/chat/completions) and as SGLang does (`"lora_path": lora_name` in
/generate); /v1/models lists them. An unknown `model` is a 404.
Weight endpoints answer {"success": true, "message": str, "version": int}, or
{"success": false, "message": str, "detail": str, "error": {...}} with a 4xx (SGLang's
shape, plus OpenAI's `error`).

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
        must fit, else 400. n x (prompt + max_tokens) must also fit the engine's KV-cache
        budget (--max-batch-tokens, else --memory-fraction of the memory free once the
        weights are loaded; one prompt's samples are never split), else 400.
  --wedged-after-s S (default 300): /health says "wedged" while an engine call makes no
        progress (no decode step) for longer; a call that steps is reported under "busy"
        (call, running_s, last_progress_s_ago, queued_requests) with status "ok".
  --max-body-mb M (default 4): a larger body on the OpenAI routes and admin endpoints is a
        413 (by Content-Length before a byte is read, or counted as a chunked body streams),
        before any parsing or tokenizing; 4 MiB holds any conversation a 128k context fits.
  --max-generate-body-mb M (default 32): the same for /generate, whose token-id batches
        from a trainer are larger (about 8 bytes an id: 32 MiB is ~4M prompt tokens).
        Big bodies are parsed, chat templates applied and prompts tokenized off the loop.
  Admin endpoints take only `Content-Type: application/json` (415) and refuse cross-site
        browser requests (`Origin` not this host: 403), so no web page can reach them.
  --max-queued-requests N (default 256): generation requests waiting for the engine (arrived,
        generation not started); past them a new one is a 429 with Retry-After before its
        body is read (`admission.py`). /health is never queued: it answers under any load.
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
Logprobs follow `baton.protocol` (log_softmax(logits / T) of the chosen token);
OpenAI `top_logprobs` (chat) and `logprobs` (completions) up to 20, as vLLM's server: the
alternatives come from one teacher-forced forward pass (`logprobs.py`; engines
without an in-process model and LoRA requests: a 400 above 1). `tool_choice` "required" or a
named function and `response_format` (json_object, json_schema) are guaranteed by
constrained decoding (`structured.py`; the `structured` extra, llguidance); /generate takes
SGLang's `json_schema` / `regex` and baton's `grammar` (Lark) the same way.
A temperature must be 0 (greedy) or >= 1e-5 (smaller ones overflow logits / T).

Concurrency: requests arriving together with identical sampling params share one
generation on the engine thread (see `batcher.py`); generations take turns in
slices of --slice-steps decode steps (default 16; up to --max-running at once, each with
its own KV cache), so a short request never waits for a long one to end, and gets the
tokens it would get alone; a client that disconnects while queued is dropped without
delaying anyone, and a running generation whose clients have all gone is cancelled
between decode steps. Weight updates and sleep let running generations finish first.

Code (the modules of `baton.rollout.server`, listed in its `__init__.py`): this module
builds the app (health, models, stats), runs it (`ServerThread`, `serve_main`); `state.py`
holds the shared state and request checks, `routes.py` the generation endpoints, `admin.py`
the admin endpoints, `batcher.py` the scheduling, `guards.py` admin requests and checkpoint
checks, `schemas.py` the request shapes; `baton/http/` the guards shared
with the gateway (auth, body caps, strict JSON, OpenAI-shaped errors).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from baton.rollout.server.admin import add_admin_routes
from baton.rollout.server.admission import DEFAULT_MAX_QUEUED_REQUESTS, Admission, WaitQueue
from baton.rollout.server.batcher import DEFAULT_MAX_RUNNING, DEFAULT_SLICE_STEPS
from baton.http import DEFAULT_MAX_BODY_BYTES, guarded_router, install_guards, run_uvicorn
from baton.rollout.embedded.kv_budget import check_budget_options
from baton.rollout.server.guards import check_admin_request
from baton.rollout.server.log import RequestLog
from baton.rollout.server.log import enable as enable_request_log
from baton.rollout.server.routes import add_generation_routes
from baton.rollout.server.schemas import errors
from baton.rollout.server.state import (DEFAULT_MAX_GENERATE_BODY_BYTES,
                                        DEFAULT_MAX_REQUEST_TOKENS, DEFAULT_WEDGED_AFTER_S, _Disconnected, _Server)
from baton.sync.backend import end_of
from baton.sync.group import is_loopback


def build_app(engine, tokenizer, model_name: str, *, max_batch_wait_ms: float = 2.0, max_batch_seqs: int = 256,
              default_max_tokens: int = 256, model_path: str | None = None, api_key: str | None = None,
              admin: bool = True, weights_dirs: Sequence[str | os.PathLike] | None = None,
              max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS, max_model_len: int | None = None,
              wedged_after_s: float = DEFAULT_WEDGED_AFTER_S, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              max_generate_body_bytes: int = DEFAULT_MAX_GENERATE_BODY_BYTES, log_requests: bool = False,
              slice_steps: int = DEFAULT_SLICE_STEPS, max_running: int = DEFAULT_MAX_RUNNING,
              max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS) -> FastAPI:
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
        srv.tok_thread.close()

    app = FastAPI(title="baton serve", lifespan=lifespan)
    srv.wait_queue = WaitQueue(max_queued_requests, lambda: srv.batcher.running)
    app.add_middleware(Admission, queue=srv.wait_queue)  # innermost: after the key and body checks
    install_guards(app, api_key=api_key, max_body_bytes=max_body_bytes,  # before any route: strict JSON
                   body_limits={"/generate": (max_generate_body_bytes, "--max-generate-body-mb")})
    app.state.baton = srv
    instance = os.environ.get("BATON_INSTANCE")
    if log_requests:
        enable_request_log()  # the logger's lines reach stderr
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

    app.include_router(info_routes(srv, model_path, instance, auth))  # /health, models, version, stats
    add_generation_routes(app, srv, errors(400, *auth, 404, 413, 499, 503))  # /v1/completions, /v1/chat/completions, /generate

    add_admin_routes(app, srv, admin_route)  # weights, update group, LoRA, sleep / wake

    return app


def info_routes(srv: _Server, model_path: str | None, instance: str | None, auth: tuple[int, ...]) -> APIRouter:
    """What the server says of itself: /health (with `baton launch`'s `instance` nonce), the
    models (/v1/models, LoRA adapters as models of their own), /get_model_info,
    /get_weight_version, /stats. `auth`: (401,) when a key is set (documented answers)."""
    router, engine, model_name = guarded_router(), srv.engine, srv.model_name

    @router.get("/health", responses={503: {"description": "Not ok: sleeping, updating or wedged; "
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

    @router.get("/v1/models", responses=errors(*auth))
    async def models() -> dict:
        data = [{"id": model_name, "object": "model", "created": 0, "owned_by": "baton"}]
        data += [{"id": name, "object": "model", "created": 0, "owned_by": "baton", "parent": model_name,
                  "root": srv.lora_paths.get(name)} for name in sorted(engine.adapters)]
        data[0]["aliases"] = srv.aliases
        return {"object": "list", "data": data}

    @router.get("/v1/models/{model_id:path}", responses=errors(*auth, 404))
    async def model(model_id: str) -> dict:
        srv.check_model(model_id)
        listed = await models()
        return next((m for m in listed["data"] if m["id"] == model_id), listed["data"][0])

    @router.get("/get_model_info", responses=errors(*auth))
    async def model_info() -> dict:
        end = end_of(engine.device)  # where a weight broadcast lands (baton.sync.backend)
        return {"model_path": model_path or model_name, "tokenizer_path": model_path, "is_generation": True,
                "device": end.kind, "gpu": end.gpu}

    @router.get("/get_weight_version", responses=errors(*auth))
    async def weight_version() -> dict:
        return {"weight_version": engine.version}

    @router.get("/stats", responses=errors(*auth))
    async def stats() -> dict:
        return {**srv.batcher.stats, "refused_busy": srv.wait_queue.refused}
    return router


class ServerThread:
    """Run an app with uvicorn on a background thread (tests, benchmarks, notebooks).

    port=0 picks a free port; `url` is known once the constructor returns. `options`: more of
    uvicorn's Config (e.g. `baton.services.api.UVICORN_OPTIONS`)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 **options: Any):
        self._sock = socket.create_server((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on", **options))
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
    ap.add_argument("model_dir", help="local Hugging Face checkpoint directory (model + tokenizer), or a .gguf file")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    ap.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (printed on stdout)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                    help="the weights' dtype; auto: bfloat16 on CUDA, float32 on the CPU (as training's defaults)")
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
    ap.add_argument("--max-queued-requests", type=int, default=DEFAULT_MAX_QUEUED_REQUESTS,
                    help="generation requests that may wait for the engine; past them a request gets 429 with "
                         "Retry-After (default %(default)s)")
    ap.add_argument("--max-batch-tokens", type=int, default=None,
                    help="engine KV-cache budget per group, fixed; n x (prompt + max_tokens) must fit it "
                         "(default: from --memory-fraction)")
    ap.add_argument("--memory-fraction", type=float, default=None,
                    help="share of the memory free after the weights that the KV cache and sampling "
                         "may take (default 0.8 unless --max-batch-tokens is given)")
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
                    help="largest request body on the OpenAI and admin routes, MiB (413 beyond; default "
                         "%(default)s)")
    ap.add_argument("--max-generate-body-mb", type=float, default=DEFAULT_MAX_GENERATE_BODY_BYTES / 2**20,
                    help="largest /generate body (token-id batches), MiB (413 beyond; default %(default)s)")
    ap.add_argument("--log-requests", action="store_true",
                    help="log one line per request (method, path, status, tokens, time) to stderr")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    if args.slice_steps < 0 or args.max_running < 1:
        ap.error(f"--slice-steps must be >= 0 and --max-running >= 1 (got {args.slice_steps}, {args.max_running})")
    if args.max_queued_requests < 1:
        ap.error(f"--max-queued-requests must be >= 1 (got {args.max_queued_requests})")
    try:
        check_budget_options(args.max_batch_tokens, args.memory_fraction)
    except ValueError as e:
        ap.error(str(e).replace("rollout.max_batch_tokens", "--max-batch-tokens")
                 .replace("rollout.memory_fraction", "--memory-fraction"))
    environ = os.environ if environ is None else environ
    args.api_key = args.api_key or environ.get("BATON_API_KEY") or None
    args.admin = is_loopback(args.host) if args.admin is None else args.admin
    from baton.models.resolve import local_model_path

    args.model_dir = Path(local_model_path(args.model_dir, "MODEL_DIR")).resolve()  # a .gguf: its HF directory
    args.weights_dirs = [Path(d).resolve() for d in (args.weight_dir_list or [args.model_dir])]
    return args


def serve_main(argv: list[str] | None = None) -> None:
    """`baton serve MODEL_DIR [--host H] [--port P] [--api-key K] [--weights-dir D] ...`"""
    args = parse_serve_args(argv)
    api_key, admin, model_dir, weights_dirs = args.api_key, args.admin, args.model_dir, args.weights_dirs

    import torch

    from baton.models.load import load_model, load_tokenizer
    from baton.models.precision import pick_device, resolve_bf16
    from baton.rollout.engines import DEFAULT_ENGINE, build_engine

    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    dtype = args.dtype if args.dtype != "auto" else "bfloat16" if resolve_bf16(None, device) else "float32"
    model = load_model(str(model_dir), dtype=getattr(torch, dtype), device=device)
    tokenizer = load_tokenizer(str(model_dir))
    engine = build_engine(DEFAULT_ENGINE, model, tokenizer, max_batch_tokens=args.max_batch_tokens,
                          memory_fraction=args.memory_fraction)
    name = args.model_name or model_dir.name
    app = build_app(engine, tokenizer, name, max_batch_wait_ms=args.max_batch_wait_ms,
                    max_batch_seqs=args.max_batch_seqs, default_max_tokens=args.default_max_tokens,
                    model_path=str(model_dir), api_key=api_key, admin=admin, weights_dirs=weights_dirs,
                    max_request_tokens=args.max_request_tokens, max_model_len=args.max_model_len,
                    wedged_after_s=args.wedged_after_s, max_body_bytes=int(args.max_body_mb * 2**20),
                    max_generate_body_bytes=int(args.max_generate_body_mb * 2**20),
                    log_requests=args.log_requests, slice_steps=args.slice_steps,
                    max_running=args.max_running, max_queued_requests=args.max_queued_requests)
    sock = socket.create_server((args.host, args.port))
    print(f"baton serve: {name} on http://{args.host}:{sock.getsockname()[1]} ({device}, {dtype})", flush=True)
    print(f"baton serve: api key {'required' if api_key else 'OFF (anyone who reaches the port may call it)'}; "
          f"admin endpoints {'on' if admin else 'off'}; weights from {', '.join(map(str, weights_dirs))}", flush=True)
    if admin and not api_key and not is_loopback(args.host):
        print("baton serve: WARNING: admin endpoints are on for a network address without --api-key", flush=True)
    run_uvicorn(app, sock, args.log_level)
