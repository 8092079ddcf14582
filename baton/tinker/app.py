"""`baton tinker MODEL_DIR`: the Tinker API (Thinking Machines' training service) served by baton,
so the official `tinker` SDK and tinker-cookbook's loops run against a local model:

    baton tinker MODEL_DIR [--host 127.0.0.1] [--port 8000] [--api-key tml-...] [--model-name NAME]
    python -c "import tinker; tinker.ServiceClient(base_url='http://127.0.0.1:8000', api_key='tml-x')"

The app is baton's HTTP layer (`baton.http.install_guards`: strict JSON, body caps) with
Tinker's error shape, `{"detail": reason}` (the SDK's exceptions show the body), and
Tinker's authentication: the SDK sends its key as `X-API-Key` (`Authorization: Bearer` is
taken too); every path but /api/v1/healthz needs it when the server has one (--api-key, or
BATON_API_KEY). The SDK itself insists on a key starting `tml-`, even for a server without
one. Routes: `baton.tinker.routes`; what they hold and run: `baton.tinker.service`.
"""

from __future__ import annotations

import argparse
import hmac
import os
import socket
import tempfile
from pathlib import Path
from typing import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from baton.http import BearerAuth, BodyTooLarge, install_guards, run_uvicorn
from baton.http.errors import validation_message
from baton.tinker.futures import Futures
from baton.tinker.routes import add_routes
from baton.tinker.service import TinkerService

HEALTH = "/api/v1/healthz"


class TinkerAuth(BearerAuth):
    """`X-API-Key: KEY` (the SDK's header) or `Authorization: Bearer KEY`; 401 {"detail"}."""

    def authorized(self, headers: Sequence[tuple[bytes, bytes]]) -> str | None:
        keys = [v for k, v in headers if k.lower() == b"x-api-key"]
        if keys:
            return None if hmac.compare_digest(keys[0].strip(), self._key) else "invalid API key"
        reason = super().authorized(headers)
        return None if reason is None else f"{reason} (or an 'X-API-Key' header)"


def detail(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


def build_app(service: TinkerService, *, api_key: str | None = None, max_body_bytes: int = 256 * 2**20,
              poll_s: float = 20.0) -> FastAPI:
    app = FastAPI(title="baton tinker")
    install_guards(app, api_key=None, max_body_bytes=max_body_bytes, flag="--max-body-mb")
    if api_key is not None:
        if not api_key:
            raise ValueError("api_key must be a non-empty string (None: no authentication)")
        app.add_middleware(TinkerAuth, api_key=api_key, public=frozenset({HEALTH}), detail=True, realm="baton-tinker")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return detail(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return detail(422, validation_message(exc)[0])

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return detail(413, str(exc), {"Connection": "close"})

    futures = Futures(poll_s=poll_s)
    app.state.service, app.state.futures = service, futures
    app.router.on_shutdown.append(futures.close)
    add_routes(app, service, futures)
    return app


def load_service(model_dir: Path, *, model_name: str | None = None, state_dir: Path | None = None,
                 max_models: int = 4, max_sample_tokens: int = 1024, device: str = "cpu",
                 aliases: Sequence[str] = ()) -> TinkerService:
    """The served model (fp32), its tokenizer and an embedded engine over it; `aliases`: more
    names `base_model` may use (a .gguf's path, for the directory converted from it)."""
    import torch

    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.engines import DEFAULT_ENGINE, build_engine, context_len

    model = load_model(str(model_dir), dtype=torch.float32, device=device)
    tokenizer = load_tokenizer(str(model_dir))
    engine = build_engine(DEFAULT_ENGINE, model, tokenizer)
    names = list(dict.fromkeys([model_name or model_dir.name, str(model_dir), str(model_dir.resolve()), *aliases]))
    state = state_dir or Path(tempfile.mkdtemp(prefix="baton-tinker-"))
    return TinkerService(model_dir.resolve(), names, tokenizer, engine, state, max_models=max_models,
                         context_len=context_len(engine) or 2048, max_sample_tokens=max_sample_tokens)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="baton tinker", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path, help="a local HF model directory or a .gguf file (what "
                                                "create_lora_training_client trains)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("BATON_API_KEY"),
                   help="the key clients send (X-API-Key; the SDK wants it to start 'tml-'); env BATON_API_KEY")
    p.add_argument("--model-name", help="the base_model name clients use (default: the directory's or the .gguf "
                                        "file's name; its path is accepted too)")
    p.add_argument("--state-dir", type=Path, help="where checkpoints (save_state, save_weights_for_sampler) go "
                                                  "(default: a new temporary directory)")
    p.add_argument("--max-models", type=int, default=4, help="training clients held at once")
    p.add_argument("--max-sample-tokens", type=int, default=1024, help="the most tokens one sample may generate")
    p.add_argument("--max-body-mb", type=float, default=256, help="the largest request body (forward_backward)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    if args.max_models < 1 or args.max_sample_tokens < 1 or args.max_body_mb <= 0 or args.threads < 0:
        p.error("--max-models, --max-sample-tokens and --max-body-mb must be positive, --threads >= 0")
    if args.api_key == "":
        p.error("--api-key must not be empty")
    from baton.models.gguf_file import is_gguf_path

    args.aliases = []
    if is_gguf_path(str(args.model_dir)):  # converted once into a cached HF directory, as `baton serve` does
        from baton.models.resolve import local_model_path

        gguf = args.model_dir
        args.model_dir = Path(local_model_path(str(gguf), "MODEL_DIR"))
        args.model_name = args.model_name or gguf.stem
        args.aliases = [str(gguf), str(gguf.resolve())]
    if not args.model_dir.is_dir():
        p.error(f"model directory not found: {str(args.model_dir)!r}")
    return args


def tinker_main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    service = load_service(args.model_dir, model_name=args.model_name, state_dir=args.state_dir,
                           max_models=args.max_models, max_sample_tokens=args.max_sample_tokens,
                           aliases=args.aliases)
    app = build_app(service, api_key=args.api_key, max_body_bytes=int(args.max_body_mb * 2**20))
    sock = socket.create_server((args.host, args.port))
    print(f"baton tinker: {service.name} on http://{args.host}:{sock.getsockname()[1]} (checkpoints in "
          f"{service.state_dir}); api key {'required' if args.api_key else 'OFF'}", flush=True)
    run_uvicorn(app, sock, args.log_level)
