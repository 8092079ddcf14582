"""`baton serve MODEL_DIR`: an HTTP inference server over an `Engine` (FastAPI + uvicorn).

Endpoints (JSON bodies; malformed input -> 422 naming the field, impossible requests ->
400 with a reason in `detail`):

  GET  /health                      {"status": "ok", "version": int}
  GET  /v1/models                   OpenAI model list (one model)
  POST /v1/completions              OpenAI completions; `prompt` may be text or token ids
                                    (vLLM style); extras: top_k, min_p, stop_token_ids,
                                    ignore_eos, return_token_ids, return_tokens_as_token_ids
  POST /v1/chat/completions         OpenAI chat; the prompt is the tokenizer's chat template
  POST /generate                    token-in / token-out, SGLang's shape (below)
  POST /update_weights_from_disk    {"model_path": file-or-dir of safetensors, "version"?: int}
  POST /init_weights_update_group   {"master_address", "master_port", "rank_offset",
                                     "world_size", "group_name"?, "backend"?}: join the
                                    trainer's group (this server is rank `rank_offset`)
  POST /update_weights_from_distributed  {"names", "dtypes", "shapes", "version"?,
                                     "group_name"?, "bucket_bytes"?}: receive a broadcast
  POST /destroy_weights_update_group, /release_memory_occupation, /resume_memory_occupation
  GET  /get_model_info, /get_weight_version, /stats
Weight endpoints answer {"success": true, "message": str, "version": int}.

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
OpenAI `top_logprobs` only ever hold the chosen token (the engine computes no others).

Concurrency: requests arriving together with identical sampling params share one
`engine.generate` call on the engine thread (see `_server_batcher.py`); a client that
disconnects while queued is dropped without delaying anyone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from baton.rollout._server_batcher import Batcher, EngineRunner
from baton.rollout._server_routes import add_generation_routes
from baton.rollout._server_schemas import (DestroyWeightsUpdateGroupRequest, InitWeightsUpdateGroupRequest,
                                           UpdateWeightsFromDiskRequest, UpdateWeightsFromDistributedRequest)
from baton.rollout.protocol import Completion, SamplingParams
from baton.sync.broadcast import WeightReceiver, validate_specs
from baton.sync.checkpoint import iter_safetensors, safetensors_files


class _Disconnected(Exception):
    pass


class _Server:
    """Everything the endpoints share."""

    def __init__(self, engine, tokenizer, model_name: str, max_batch_wait_ms: float, max_batch_seqs: int,
                 default_max_tokens: int, model_path: str | None):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.model_path = model_path
        self.default_max_tokens = default_max_tokens
        self.runner = EngineRunner(engine)
        self.batcher = Batcher(self.runner, max_wait_ms=max_batch_wait_ms, max_batch_seqs=max_batch_seqs)
        self.receiver = WeightReceiver(engine)
        cfg = getattr(getattr(engine, "model", None), "config", None)
        self.vocab_size = getattr(cfg, "vocab_size", None) or (len(tokenizer) if tokenizer is not None else None)

    # --- helpers -----------------------------------------------------------------------
    def need_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise HTTPException(400, "this server has no tokenizer: send token ids (/generate input_ids)")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.need_tokenizer()(text)["input_ids"])

    def check_prompts(self, prompts: list[list[int]]) -> None:
        if not prompts:
            raise HTTPException(400, "no prompts given")
        for i, p in enumerate(prompts):
            if not p:
                raise HTTPException(400, f"prompt {i} is empty")
            if self.vocab_size is not None and any(t < 0 or t >= self.vocab_size for t in p):
                raise HTTPException(400, f"prompt {i} has a token id outside [0, {self.vocab_size})")

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

    async def generate(self, request: Request, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Batched generate that gives up (and withdraws the request) if the client leaves."""
        self.check_prompts(prompts)
        task = asyncio.ensure_future(self.batcher.submit(prompts, params))
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if task not in done:
            task.cancel()  # withdraws it if its batch has not started
            raise _Disconnected()
        try:
            return task.result()
        except (ValueError, KeyError) as exc:
            raise HTTPException(400, f"generation failed: {exc}") from exc
        except Exception as exc:
            raise HTTPException(500, f"generation failed: {type(exc).__name__}: {exc}") from exc


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
            return int(req.weight_version)
        except ValueError as exc:
            raise HTTPException(400, f"weight_version must be an integer here, got {req.weight_version!r}") from exc
    return current + 1


def _fail(status: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message, "detail": message}, status_code=status)


def build_app(engine, tokenizer, model_name: str, *, max_batch_wait_ms: float = 2.0, max_batch_seqs: int = 256,
              default_max_tokens: int = 256, model_path: str | None = None) -> FastAPI:
    """The FastAPI app serving `engine`. `tokenizer` may be None (token-id endpoints only)."""
    srv = _Server(engine, tokenizer, model_name, max_batch_wait_ms, max_batch_seqs, default_max_tokens, model_path)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await srv.batcher.close()
        srv.receiver.close()
        srv.runner.close()

    app = FastAPI(title="baton serve", lifespan=lifespan)
    app.state.baton = srv

    @app.exception_handler(_Disconnected)
    async def _gone(request: Request, exc: _Disconnected) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "version": engine.version}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "baton"}]}

    @app.get("/get_model_info")
    async def model_info() -> dict:
        return {"model_path": model_path or model_name, "tokenizer_path": model_path, "is_generation": True}

    @app.get("/get_weight_version")
    async def weight_version() -> dict:
        return {"weight_version": engine.version}

    @app.get("/stats")
    async def stats() -> dict:
        return dict(srv.batcher.stats)

    add_generation_routes(app, srv)  # /v1/completions, /v1/chat/completions, /generate

    @app.post("/update_weights_from_disk")
    async def update_from_disk(req: UpdateWeightsFromDiskRequest) -> Any:
        version = _weights_version(req, engine.version)
        try:
            safetensors_files(req.model_path)  # fail fast, with the path in the message
            await srv.runner.call(lambda: engine.update_weights(iter_safetensors(req.model_path), version))
        except (FileNotFoundError, KeyError, ValueError) as exc:
            return _fail(400, f"update_weights_from_disk failed: {exc}")
        return {"success": True, "message": f"loaded {req.model_path}", "version": engine.version,
                "num_paused_requests": 0}

    @app.post("/init_weights_update_group")
    async def init_group(req: InitWeightsUpdateGroupRequest) -> Any:
        backend = req.backend
        if backend == "auto":
            device = getattr(engine, "device", None)
            backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
        try:
            # Not on the engine thread: joining waits for the trainer, generation goes on.
            await asyncio.to_thread(srv.receiver.init_weights_update_group, req.master_address, req.master_port,
                                    req.rank_offset, req.world_size, req.group_name, backend, req.timeout_s)
        except Exception as exc:  # noqa: BLE001 - bad address, timeout, duplicate group ...
            return _fail(400, f"init_weights_update_group failed: {type(exc).__name__}: {exc}")
        return {"success": True, "message": f"joined {req.group_name!r} as rank {req.rank_offset} ({backend})"}

    @app.post("/update_weights_from_distributed")
    async def update_from_distributed(req: UpdateWeightsFromDistributedRequest) -> Any:
        version = _weights_version(req, engine.version)
        bucket_bytes = req.bucket_bytes or None
        if req.group_name not in srv.receiver.groups:
            return _fail(400, f"no weight update group {req.group_name!r}: call /init_weights_update_group first")
        try:
            validate_specs(req.names, req.dtypes, req.shapes)
            await srv.runner.call(srv.receiver.update_weights_from_distributed, req.names, req.dtypes, req.shapes,
                                  version, req.group_name, bucket_bytes)
        except (KeyError, ValueError) as exc:
            return _fail(400, f"update_weights_from_distributed failed: {exc}")
        return {"success": True, "message": f"received {len(req.names)} tensors", "version": engine.version}

    @app.post("/destroy_weights_update_group")
    async def destroy_group(req: DestroyWeightsUpdateGroupRequest) -> Any:
        try:
            srv.receiver.destroy_weights_update_group(req.group_name)
        except ValueError as exc:
            return _fail(400, str(exc))
        return {"success": True, "message": f"destroyed {req.group_name!r}"}

    @app.post("/release_memory_occupation")
    async def release_memory() -> dict:
        await srv.runner.call(engine.sleep)
        return {"success": True, "message": "asleep"}

    @app.post("/resume_memory_occupation")
    async def resume_memory() -> dict:
        await srv.runner.call(engine.wake)
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


def serve_main(argv: list[str] | None = None) -> None:
    """`baton serve MODEL_DIR [--host H] [--port P] ...`"""
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
    ap.add_argument("--max-batch-tokens", type=int, default=65536, help="engine KV-cache budget per group")
    ap.add_argument("--default-max-tokens", type=int, default=256, help="chat max_tokens when the client gives none")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)

    import torch

    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.engine import EmbeddedEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model = load_model(args.model_dir, dtype=getattr(torch, args.dtype), device=device)
    tokenizer = load_tokenizer(args.model_dir)
    engine = EmbeddedEngine(model, tokenizer, max_batch_tokens=args.max_batch_tokens)
    name = args.model_name or Path(args.model_dir).resolve().name
    app = build_app(engine, tokenizer, name, max_batch_wait_ms=args.max_batch_wait_ms,
                    max_batch_seqs=args.max_batch_seqs, default_max_tokens=args.default_max_tokens,
                    model_path=str(Path(args.model_dir).resolve()))
    sock = socket.create_server((args.host, args.port))
    print(f"baton serve: {name} on http://{args.host}:{sock.getsockname()[1]} ({device}, {args.dtype})", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level))
    server.run(sockets=[sock])
