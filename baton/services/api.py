"""`baton api`: the trajectory API. Environments push scored groups; the trainer pulls batches.

    baton api [--host 127.0.0.1] [--port 8000] [--db baton_api.sqlite] [--max-queue 1024]
              [--token T | env BATON_API_TOKEN]

Wire-compatible with Atropos's API (atroposlib 0.4.0), so an existing Atropos environment
runs against it unchanged (shapes: `docs/` and shared/reference/atropos-protocol.md):

  POST /register          trainer: {wandb_group, wandb_project, batch_size, max_token_len,
                          checkpoint_dir, save_checkpoint_interval, starting_step, num_steps}
                          (+ baton's optional `max_staleness`) -> {"uuid"}; the first fixes
                          the settings, later ones (a trainer reconnecting) keep them
  POST /register-env      {max_token_length, desired_name, weight, group_size,
                          min_batch_allocation?} -> {"status": "wait for trainer to start"}
                          until the trainer's first GET /batch, then {"status": "success",
                          env_id, wandb_name, checkpoint_dir, starting_step,
                          checkpoint_interval, num_steps}
  POST /disconnect-env    {env_id}
  GET  /info, /wandb_info, /status, /latest_example, /reset_data
  GET  /status-env        JSON body {env_id} on a GET -> current_step, queue_size (in groups),
                          self_queue_size, env_weight, unallocated_fraction, max_group_size
                          (+ baton's max_queue, trainer_version, max_staleness, batch_size)
  GET  /batch             {"batch": null} or {"batch": [ScoredData, ...]}: exactly batch_size
                          sequences of whole groups, each delivered once, every key present
  POST /scored_data       one ScoredData; /scored_data_list a JSON array of them. Bodies may
                          be gzip (Content-Encoding: gzip). Unknown keys are ignored.

Where it departs from (improves on) Atropos:
  * batches are formed oldest-first, one per GET /batch (Atropos serves newest-first);
  * every group carries `policy_version`: the pusher's top-level `policy_version`, or
    `group_overrides.policy_version`; a group without one (a stock Atropos env) is stamped
    with the trainer's version at push time (an upper bound: its true age may be larger).
    GET /batch?version=V&max_staleness=S marks queued groups older than V - S `stale` and
    serves the rest (the stale ones are kept in the store and counted in /status and in the
    batch's `stale_groups`, never silently deleted); with a registered `max_staleness` a push
    that is already too old is refused with 409 and the reason;
  * the queue is bounded (--max-queue groups): a push beyond it gets 429 with Retry-After
    (a list is queued whole or not at all);
  * groups are persisted (SQLite, WAL, synchronous=FULL): a restarted API on the same --db
    serves every group it acknowledged;
  * malformed ScoredData (shape mismatch, non-finite score, mask that is neither -100 nor
    the token) is a 422 naming the group, sequence and field; in a list the valid groups are
    queued and the 422 lists which were not;
  * optional bearer token (every path but /health); binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import hmac
import json
import math
import os
import socket
import time
import uuid
import zlib
from typing import Any, Optional

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from baton.services.store import GroupStore

MIN_ENV_WEIGHT = 0.01  # as Atropos: no env is starved entirely
MAX_BODY_BYTES = 256 * 2**20  # decompressed; a gzip bomb stops here
SCORED_KEYS = ("tokens", "masks", "scores", "advantages", "ref_logprobs", "messages", "generation_params",
               "inference_logprobs", "overrides", "group_overrides", "images", "env_id")


class BearerAuth:
    """ASGI middleware: `Authorization: Bearer <token>` on every path but /health (constant-time
    compare; 401 with the reason). Its own small copy, not baton.rollout's: that module
    imports torch, and the API process should start in a second."""

    def __init__(self, app, token: str):
        self.app, self._token = app, token.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("path") == "/health":
            return await self.app(scope, receive, send)
        values = [v for k, v in scope.get("headers") or [] if k.lower() == b"authorization"]
        scheme, _, given = (values[0].strip() if values else b"").partition(b" ")
        if scheme.lower() == b"bearer" and given and hmac.compare_digest(given.strip(), self._token):
            return await self.app(scope, receive, send)
        reason = "missing or invalid 'Authorization: Bearer <token>' header" if values else \
            "missing 'Authorization: Bearer <token>' header"
        body = json.dumps({"detail": reason}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b'Bearer realm="baton api"')]})
        await send({"type": "http.response.body", "body": body})


class Registration(BaseModel):
    model_config = ConfigDict(extra="ignore")
    wandb_group: str = ""
    wandb_project: str = ""
    batch_size: int
    max_token_len: int
    checkpoint_dir: str = ""
    save_checkpoint_interval: int = 0
    starting_step: int = 0
    num_steps: int = -1
    max_staleness: Optional[int] = None  # baton: refuse pushes older than this many versions


class RegisterEnv(BaseModel):
    model_config = ConfigDict(extra="ignore")
    max_token_length: int
    desired_name: str
    weight: float = 1.0
    group_size: int
    min_batch_allocation: Optional[float] = None


class EnvIdentifier(BaseModel):
    model_config = ConfigDict(extra="ignore")
    env_id: int


class ScoredData(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: Optional[list[list[float]]] = None
    ref_logprobs: Optional[list[list[float]]] = None
    messages: Optional[list[list[dict[str, Any]]]] = None
    generation_params: Optional[dict[str, Any]] = None
    inference_logprobs: Optional[list[list[float]]] = None
    overrides: Optional[list[dict]] = None
    group_overrides: Optional[dict] = None
    images: Optional[Any] = None
    env_id: Optional[int] = None
    # baton's additions (ignored by Atropos trainers):
    policy_version: Optional[int] = None  # the weight version that sampled the group
    finish_reasons: Optional[list[str]] = None  # "stop" | "length" per sequence


def check_group(g: ScoredData) -> str | None:
    """Why a group cannot be trained on, or None."""
    n = len(g.tokens)
    if n == 0:
        return "tokens is empty (a group needs at least one sequence)"
    if len(g.masks) != n or len(g.scores) != n:
        return f"tokens, masks and scores must have one entry per sequence (got {n}, {len(g.masks)}, {len(g.scores)})"
    for i, (t, m) in enumerate(zip(g.tokens, g.masks)):
        if not t:
            return f"sequence {i}: tokens is empty"
        if len(m) != len(t):
            return f"sequence {i}: masks has {len(m)} entries for {len(t)} tokens"
        for j, (tok, mk) in enumerate(zip(t, m)):
            if mk != -100 and mk != tok:
                return (f"sequence {i}, position {j}: mask {mk} is neither -100 (not trained) nor the token "
                        f"id {tok} (trained)")
    for i, s in enumerate(g.scores):
        if not math.isfinite(s):
            return f"sequence {i}: score {s} is not finite"
    for name in ("inference_logprobs", "ref_logprobs", "advantages"):
        v = getattr(g, name)
        if v is None or v == []:
            continue
        if len(v) != n or any(len(a) != len(t) for a, t in zip(v, g.tokens)):
            return f"{name} must be aligned to tokens (one list per sequence, one value per token)"
    for name in ("overrides", "finish_reasons"):
        v = getattr(g, name)
        if v not in (None, []) and len(v) != n:
            return f"{name} must have one entry per sequence (got {len(v)} for {n})"
    return None


def group_version(g: ScoredData) -> int | None:
    if g.policy_version is not None:
        return g.policy_version
    v = (g.group_overrides or {}).get("policy_version")
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


async def _read_json(request: Request, required: bool = True) -> Any:
    """The body as JSON, gunzipped when `Content-Encoding: gzip` (Atropos envs gzip bodies
    of 1 KB or more); 400 with the reason for a bad body."""
    raw = await request.body()
    encoding = request.headers.get("content-encoding", "").lower()
    if "gzip" in encoding and raw:
        try:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            raw = d.decompress(raw, MAX_BODY_BYTES + 1)
            if len(raw) > MAX_BODY_BYTES or d.unconsumed_tail:
                raise HTTPException(413, f"decompressed body exceeds {MAX_BODY_BYTES} bytes")
        except zlib.error as exc:
            raise HTTPException(400, f"invalid gzip body: {exc}") from exc
    if not raw:
        if required:
            raise HTTPException(400, "empty body: expected JSON")
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HTTPException(400, f"body is not valid JSON: {exc}") from exc


def _parse(model: type[BaseModel], data: Any, where: str = "body") -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise HTTPException(422, f"{where}: {loc or 'value'}: {first.get('msg')} "
                                 f"({exc.error_count()} error(s))") from None


class TrajectoryAPI:
    """State shared by the endpoints: the store and the settings."""

    def __init__(self, store: GroupStore, max_queue: int, retry_after_s: float, env_timeout_s: float):
        self.store, self.max_queue = store, max_queue
        self.retry_after_s, self.env_timeout_s = retry_after_s, env_timeout_s

    @property
    def registration(self) -> dict[str, Any] | None:
        return self.store.get("registration")

    def trainer_version(self) -> int | None:
        return self.store.get("trainer_version")

    def env_status(self) -> list[dict[str, Any]]:
        now = time.time()
        return [{"env_id": e["env_id"], "name": e["real_name"], "connected": bool(e["connected"]),
                 "group_size": e["group_size"], "last_seen_s": round(now - e["last_seen"], 1),
                 "alive": bool(e["connected"]) and now - e["last_seen"] < self.env_timeout_s}
                for e in self.store.envs()]

    def admit(self, groups: list[ScoredData]) -> tuple[list[tuple], list[dict[str, Any]]]:
        """(rows to queue, rejections) for pushed groups."""
        reg = self.registration or {}
        batch_size, max_staleness = reg.get("batch_size"), reg.get("max_staleness")
        trainer_version = self.trainer_version()
        rows, rejected = [], []
        for i, g in enumerate(groups):
            why = check_group(g)
            version = group_version(g)
            if why is None and batch_size and len(g.tokens) > batch_size:
                why = f"group of {len(g.tokens)} sequences can never fit a batch of {batch_size}"
            if (why is None and version is not None and trainer_version is not None and max_staleness is not None
                    and max_staleness >= 0 and version < trainer_version - max_staleness):
                rejected.append({"index": i, "status": 409, "reason": (
                    f"stale: policy_version {version} is more than max_staleness={max_staleness} behind the "
                    f"trainer's version {trainer_version}")})
                continue
            if why is not None:
                rejected.append({"index": i, "status": 422, "reason": why})
                continue
            body = {k: getattr(g, k) for k in SCORED_KEYS}
            body["finish_reasons"] = g.finish_reasons
            body["policy_version_source"] = "pusher" if version is not None else "stamped"
            if version is None:
                version = trainer_version or 0
            rows.append((body, g.env_id, len(g.tokens), version))
        return rows, rejected


def build_api_app(db_path: str, *, max_queue: int = 1024, token: str | None = None, retry_after_s: float = 1.0,
                  env_timeout_s: float = 60.0, keep_served: int = 1000) -> FastAPI:
    """The FastAPI app of `baton api` over the store at `db_path` (created if missing)."""
    if token is not None and not token:
        raise ValueError("token must be a non-empty string (None: no authentication)")
    if max_queue < 1:
        raise ValueError(f"max_queue must be >= 1, got {max_queue}")
    api = TrajectoryAPI(GroupStore(db_path, keep_served=keep_served), max_queue, retry_after_s, env_timeout_s)
    app = FastAPI(title="baton api")
    app.state.api = api
    if token is not None:
        app.add_middleware(BearerAuth, token=token)
    store = api.store

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _json_response({"detail": exc.detail}, exc.status_code, getattr(exc, "headers", None))

    @app.get("/")
    async def root() -> dict:
        return {"message": "baton trajectory API (Atropos-compatible)"}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/register")
    async def register(request: Request) -> JSONResponse:
        reg = _parse(Registration, await _read_json(request))
        if reg.batch_size < 1:
            raise HTTPException(422, f"batch_size must be >= 1, got {reg.batch_size}")
        current = api.registration
        if current is None:  # the first trainer fixes the settings (as Atropos)
            store.set(registration=reg.model_dump(), current_step=reg.starting_step)
        elif reg.max_staleness != current.get("max_staleness"):  # a reconnecting trainer may change the bound
            store.set(registration={**current, "max_staleness": reg.max_staleness})
        requester = uuid.uuid4().int
        return _json_response({"uuid": requester})

    @app.post("/register-env")
    async def register_env(request: Request) -> JSONResponse:
        env = _parse(RegisterEnv, await _read_json(request))
        reg = api.registration
        if reg is None or not store.get("started", False):
            return _json_response({"status": "wait for trainer to start"})
        added = store.add_env(env.desired_name, env.max_token_length, env.weight if env.weight is not None else 1.0,
                              env.group_size, env.min_batch_allocation)
        return _json_response({"status": "success", "env_id": added["env_id"], "wandb_name": added["real_name"],
                               "checkpoint_dir": reg.get("checkpoint_dir", ""),
                               "starting_step": store.get("current_step", 0),
                               "checkpoint_interval": reg.get("save_checkpoint_interval", 0),
                               "num_steps": reg.get("num_steps", -1)})

    @app.post("/disconnect-env")
    async def disconnect_env(request: Request) -> JSONResponse:
        env = _parse(EnvIdentifier, await _read_json(request))
        if not store.touch_env(env.env_id, connected=False):
            return _json_response({"status": "failure", "error": f"no env with id {env.env_id}"})
        return _json_response({"status": "success"})

    @app.get("/wandb_info")
    async def wandb_info() -> JSONResponse:
        reg = api.registration or {}
        return _json_response({"group": reg.get("wandb_group"), "project": reg.get("wandb_project"), "zmq_port": None})

    @app.get("/info")
    async def info() -> JSONResponse:
        reg = api.registration
        if reg is None:
            return _json_response({"batch_size": -1, "max_token_len": -1})
        return _json_response({"batch_size": reg["batch_size"], "max_token_len": reg["max_token_len"]})

    @app.get("/batch")
    async def batch(version: Optional[int] = None, max_staleness: Optional[int] = None) -> JSONResponse:
        """One batch (oldest groups first) or {"batch": null}. `version`: the trainer's
        current weight version (remembered: it stamps pushes without one and bounds them);
        `max_staleness`: serve no group sampled more than this many versions before it."""
        reg = api.registration
        if reg is None:
            raise HTTPException(409, "no trainer has registered: POST /register first")
        if not store.get("started", False):
            store.set(started=True)
        if version is not None:
            store.set(trainer_version=version)
        if max_staleness is None:
            max_staleness = reg.get("max_staleness")
        step = store.get("current_step", 0) + 1
        groups, stale = store.take_batch(reg["batch_size"], step, version, max_staleness)
        body: dict[str, Any] = {"batch": groups}
        if stale:
            body["stale_groups"] = stale
        if groups is not None:
            for g in groups:  # every ScoredData key present (null where absent)
                for k in SCORED_KEYS:
                    g.setdefault(k, None)
        return _json_response(body)

    @app.get("/latest_example")
    async def latest_example() -> JSONResponse:
        latest = store.latest()
        if latest is None:
            return _json_response({k: [] for k in ("tokens", "masks", "scores", "advantages", "ref_logprobs",
                                                   "generation_params", "inference_logprobs", "messages",
                                                   "images")})
        return _json_response(latest)

    def _push(groups: list[ScoredData]) -> tuple[int, list[dict[str, Any]]]:
        rows, rejected = api.admit(groups)
        if rows:
            if store.push_many(rows, max_queued=api.max_queue) is None:
                counts = store.counts()
                raise HTTPException(429, f"queue full: {counts['queued_groups']} groups queued, the bound is "
                                         f"{api.max_queue} (--max-queue); retry later",
                                    headers={"Retry-After": f"{max(1, math.ceil(api.retry_after_s))}"})
            for env_id in {r[1] for r in rows if r[1] is not None}:
                store.touch_env(env_id)
        return len(rows), rejected

    @app.post("/scored_data")
    async def scored_data(request: Request) -> JSONResponse:
        data = await _read_json(request)
        if not isinstance(data, dict):
            raise HTTPException(422, f"expected one ScoredData object, got {type(data).__name__}")
        group = _parse(ScoredData, data, "ScoredData")
        queued, rejected = _push([group])
        if rejected:
            raise HTTPException(rejected[0]["status"], rejected[0]["reason"])
        return _json_response({"status": "received"})

    @app.post("/scored_data_list")
    async def scored_data_list(request: Request) -> JSONResponse:
        data = await _read_json(request)
        if not isinstance(data, list):
            raise HTTPException(422, f"expected a JSON array of ScoredData, got {type(data).__name__}")
        groups, bad = [], []
        for i, item in enumerate(data):
            try:
                groups.append((i, _parse(ScoredData, item, f"group {i}")))
            except HTTPException as exc:
                bad.append({"index": i, "status": 422, "reason": exc.detail})
        queued, rejected = _push([g for _, g in groups])
        rejected = bad + [{**r, "index": groups[r["index"]][0]} for r in rejected]
        if rejected:
            rejected.sort(key=lambda r: r["index"])
            status = 409 if all(r["status"] == 409 for r in rejected) else 422
            raise HTTPException(status, {"message": f"{len(rejected)} of {len(data)} groups rejected; "
                                                    f"{queued} queued",
                                         "queued": queued, "rejected": rejected})
        return _json_response({"status": "received", "groups_processed": len(data)})

    @app.get("/status")
    async def status() -> JSONResponse:
        counts = store.counts()
        reg = api.registration or {}
        return _json_response({"current_step": store.get("current_step", 0), "queue_size": counts["queued_groups"],
                               **counts, "max_queue": api.max_queue, "trainer_version": api.trainer_version(),
                               "max_staleness": reg.get("max_staleness"), "batch_size": reg.get("batch_size", -1),
                               "registered": bool(reg), "started": bool(store.get("started", False)),
                               "envs": api.env_status()})

    @app.get("/status-env")
    async def status_env(request: Request) -> JSONResponse:
        env_req = _parse(EnvIdentifier, await _read_json(request))
        envs = {e["env_id"]: e for e in store.envs()}
        me = envs.get(env_req.env_id)
        if me is None:
            raise HTTPException(404, f"no env with id {env_req.env_id}: POST /register-env first")
        store.touch_env(me["env_id"])
        connected = [e for e in envs.values() if e["connected"]]
        total = sum(e["max_token_length"] * max(0.0, e["weight"]) for e in connected) or 1.0
        weight = max(MIN_ENV_WEIGHT, me["max_token_length"] * me["weight"] / total)
        min_alloc = sum(e["min_batch_allocation"] or 0.0 for e in connected if e["min_batch_allocation"] is not None)
        queued = store.queued_meta()
        group_size = max([me["group_size"]] + [size for _, env, size, _ in queued if env == me["env_id"]])
        if group_size != me["group_size"]:
            store.update_env_group_size(me["env_id"], group_size)
        reg = api.registration or {}
        return _json_response({
            "current_step": store.get("current_step", 0),
            "queue_size": sum(size for *_, size, _ in queued) // group_size,  # in groups, not sequences
            "self_queue_size": sum(size for _, env, size, _ in queued if env == me["env_id"]) // group_size,
            "env_weight": weight, "unallocated_fraction": 1.0 - min(min_alloc, 1.0),
            "max_group_size": max([1] + [size for _, _, size, _ in queued]),
            "max_queue": api.max_queue, "trainer_version": api.trainer_version(),
            "max_staleness": reg.get("max_staleness"), "batch_size": reg.get("batch_size", -1)})

    @app.get("/reset_data")
    async def reset_data() -> PlainTextResponse:
        store.reset()
        return PlainTextResponse("Reset successful", status_code=200)

    return app


def parse_api_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="baton api", description="The trajectory API (Atropos-compatible).")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    ap.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (printed on stdout)")
    ap.add_argument("--db", default="baton_api.sqlite", help="SQLite file of the queue (kept across restarts)")
    ap.add_argument("--max-queue", type=int, default=1024, help="queued groups beyond which pushes get 429")
    ap.add_argument("--retry-after-s", type=float, default=1.0, help="Retry-After of a 429")
    ap.add_argument("--env-timeout-s", type=float, default=60.0,
                    help="an env not heard from for this long is reported as not alive in /status")
    ap.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (default: env "
                                                  "BATON_API_TOKEN; unset: no authentication)")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    args.token = args.token or os.environ.get("BATON_API_TOKEN") or None
    return args


def api_main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = parse_api_args(argv)
    app = build_api_app(args.db, max_queue=args.max_queue, token=args.token, retry_after_s=args.retry_after_s,
                        env_timeout_s=args.env_timeout_s)
    sock = socket.create_server((args.host, args.port))
    counts = app.state.api.store.counts()
    print(f"baton api: http://{args.host}:{sock.getsockname()[1]} (db {args.db}: {counts['queued_groups']} groups "
          f"queued; token {'required' if args.token else 'OFF'})", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level=args.log_level)).run(sockets=[sock])


if __name__ == "__main__":
    api_main()
