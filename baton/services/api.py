"""`baton api`: the trajectory API. Environments push scored groups; the trainer pulls batches.

    baton api [--host 127.0.0.1] [--port 8000] [--db baton_api.sqlite] [--max-queue 1024]
              [--token T | env BATON_API_TOKEN]

Wire-compatible with Atropos's API (atroposlib 0.4.0), so an existing Atropos environment
runs against it unchanged (shapes: `docs/` and shared/reference/atropos-protocol.md):

  POST /register          trainer: {wandb_group, wandb_project, batch_size, max_token_len,
                          checkpoint_dir, save_checkpoint_interval, starting_step, num_steps}
                          (+ baton's optional `max_staleness`) -> {"uuid"}; the first fixes
                          the settings, later ones (a trainer reconnecting) must repeat them
  POST /register-env      {max_token_length, desired_name, weight, group_size,
                          min_batch_allocation?} -> {"status": "wait for trainer to start"}
                          until the trainer's first GET /batch, then {"status": "success",
                          env_id, wandb_name, checkpoint_dir, starting_step,
                          checkpoint_interval, num_steps}
  POST /disconnect-env    {env_id}
  GET  /info, /wandb_info, /status, /latest_example
  POST /reset_data[?force=true]  (refused with 409 while a trainer is registered, unless forced)
  GET  /status-env        JSON body {env_id} on a GET -> current_step, queue_size (in groups),
                          self_queue_size, env_weight, unallocated_fraction, max_group_size
                          (+ baton's max_queue, trainer_version, max_staleness, batch_size)
  GET  /batch             {"batch": null} or {"batch": [ScoredData, ...]}: exactly batch_size
                          sequences of whole groups, every key present; with ?ack=BATCH_ID
                          (baton) at-least-once: every batch up to BATCH_ID acknowledged, an
                          unacknowledged one served again (&after=HELD: the oldest above
                          HELD) until it is (an ack of a batch never handed out: 409,
                          nothing marked)
  POST /ack?ack=BATCH_ID  (baton) acknowledge every batch up to BATCH_ID: the trainer calls it
                          once a checkpoint holds their update
  POST /scored_data       one ScoredData; /scored_data_list a JSON array of them. Bodies may
                          be gzip (Content-Encoding: gzip). Unknown keys are ignored.
                          (baton) an `Idempotency-Key` header makes a push idempotent: its
                          retry is answered 200 (`duplicate(s)`) and not queued again

Where it departs from (improves on) Atropos:
  * batches are formed oldest-first, one per GET /batch (Atropos serves newest-first);
  * every group carries `policy_version`: the pusher's top-level `policy_version`, or
    `group_overrides.policy_version`; a group without one (a stock Atropos env) is stamped
    with the trainer's version at push time (an upper bound: its true age may be larger).
    GET /batch?version=V&max_staleness=S marks queued groups older than V - S `stale` and
    serves the rest (the stale ones are kept in the store and counted in /status and in the
    batch's `stale_groups`, never silently deleted); with a registered `max_staleness` a push
    that is already too old is refused with 409 and the reason; a `policy_version` above the
    trainer's version + 1 (its next weights, which servers may have before it pulls) is a 422;
  * the queue is bounded (--max-queue groups): a push beyond it gets 429 with Retry-After
    (a list is queued whole or not at all);
  * groups are persisted (SQLite, WAL, synchronous=FULL): a restarted API on the same --db
    serves every group it acknowledged;
  * malformed ScoredData (shape mismatch, non-finite score, mask that is neither -100 nor
    the token) is a 422 naming the group, sequence and field; in a list the valid groups are
    queued and the 422 lists which were not;
  * the registration fixes batch_size, max_token_len (+ baton's group_size, vocab_size): a
    push that breaks them is a 422 naming the field, a trainer asking for others a 409
    naming both values; bodies are capped (--max-body-mb, plain and decompressed);
  * a group pushed with the `env_id` of a registered environment must have that
    environment's `group_size` (else 422 naming both numbers); Atropos instead buffers such
    groups until several add up to the size, which mixes prompts inside one "group" and
    breaks group-relative advantages (a group without `env_id`, or with an unknown one, is
    checked against the trainer's registration only, as before);
  * optional bearer token (every path but /health); binds 127.0.0.1 unless told otherwise;
  * nothing touching SQLite or a body's contents runs on the event loop (worker threads;
    pushes share transactions: group commit), so /health answers under load.

Code: this file holds the endpoints (`build_api_app`) and the CLI; `_api_state.py` the state
they share and a push admitted group by group; `_api_schemas.py` the request shapes and group checks, `_api_http.py` the token middleware and capped body
reading, `store.py` the SQLite queue.
"""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from typing import Any, Iterable, Optional

import anyio
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from baton.http import BearerAuth
from baton.services._api_http import (MAX_BODY_BYTES, _json_response, _parse, _read_body, decode_json,
                                      decode_json_array)
from baton.services._api_schemas import (FIXED_SETTINGS, SCORED_KEYS, EnvIdentifier, RegisterEnv, Registration,
                                         encode_json)
from baton.services._api_state import TrajectoryAPI
from baton.services.store import AckError, GroupStore

MIN_ENV_WEIGHT = 0.01  # as Atropos: no env is starved entirely
PUSH_THREADS = 4  # pushes checked and written at once (worker threads; the rest wait, off the loop)


MAX_KEY_CHARS = 255  # an Idempotency-Key's length at most (400 beyond, naming it)
# uvicorn's options for `baton api`: headers up to 1 MiB reach the app (h11's default, 16 KiB,
# answers a longer one with a bare 400 or a closed connection), so a long key is refused by name
UVICORN_OPTIONS = {"h11_max_incomplete_event_size": 2**20}


def build_api_app(db_path: str, *, max_queue: int = 1024, token: str | None = None, retry_after_s: float = 1.0,
                  env_timeout_s: float = 60.0, keep_served: int = 1000,
                  max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app of `baton api` over the store at `db_path` (created if missing): its
    routers, for the trainer (`trainer_routes`), the environments (`env_routes`) and their
    pushes (`push_routes`), behind the bearer token of the shared HTTP layer.

    Nothing that touches SQLite or walks a body runs on the event loop: endpoints without a
    body are plain `def` (FastAPI runs them in its thread pool); the others read the body
    there, then decode, check and write in a worker thread (pushes: at most PUSH_THREADS at
    once, so the trainer's /batch always finds a thread). /health stays on the loop."""
    if token is not None and not token:
        raise ValueError("token must be a non-empty string (None: no authentication)")
    if max_queue < 1:
        raise ValueError(f"max_queue must be >= 1, got {max_queue}")
    api = TrajectoryAPI(GroupStore(db_path, keep_served=keep_served), max_queue, retry_after_s, env_timeout_s)
    app = FastAPI(title="baton api")
    app.state.api = api
    if token is not None:
        app.add_middleware(BearerAuth, api_key=token, detail=True, realm="baton api")

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _json_response({"detail": exc.detail}, exc.status_code, getattr(exc, "headers", None))

    async def read(request: Request, required: bool = True) -> Any:
        """A request's JSON body, capped at max_body_bytes, decoded in a worker thread."""
        return await run_in_threadpool(decode_json, await _read_body(request, max_body_bytes), required)

    for router in (service_routes(), trainer_routes(api, read), env_routes(api, read), push_routes(api, max_body_bytes)):
        app.include_router(router)
    return app


def service_routes() -> APIRouter:
    """/ and /health (the latter echoes `baton launch`'s BATON_INSTANCE nonce)."""
    router = APIRouter()

    @router.get("/")
    async def root() -> dict:
        return {"message": "baton trajectory API (Atropos-compatible)"}

    instance = os.environ.get("BATON_INSTANCE")  # set by `baton launch`: its readiness check's nonce

    @router.get("/health")
    async def health() -> dict:
        return {"status": "ok", **({"instance": instance} if instance else {})}

    return router


def trainer_routes(api: TrajectoryAPI, read: Any) -> APIRouter:
    """What the trainer calls: /register, /batch, /info, /wandb_info, /status, /reset_data
    (`read`: the app's body reader)."""
    router, store = APIRouter(), api.store

    @router.post("/register")
    async def register(request: Request) -> JSONResponse:
        return await run_in_threadpool(_register, await read(request))

    def _register(data: Any) -> JSONResponse:
        reg = _parse(Registration, data, "registration")
        current = api.registration
        if current is None:  # the first trainer fixes the settings (as Atropos)
            store.set(registration=reg.model_dump(), current_step=reg.starting_step)
            return _json_response({"uuid": uuid.uuid4().int})
        conflicts = [f"{k}: registered {current.get(k)}, this trainer asks for {getattr(reg, k)}"
                     for k in FIXED_SETTINGS if getattr(reg, k) != current.get(k)]
        if conflicts:  # never train silently on another trainer's settings (an earlier run's --db)
            raise HTTPException(409, "a trainer with other settings is registered (" + "; ".join(conflicts) +
                                "): use a new --db, or POST /reset_data?force=true to drop its queue")
        if reg.max_staleness != current.get("max_staleness"):  # a reconnecting trainer may change the bound
            store.set(registration={**current, "max_staleness": reg.max_staleness})
        requester = uuid.uuid4().int
        return _json_response({"uuid": requester})

    @router.get("/wandb_info")
    def wandb_info() -> JSONResponse:
        reg = api.registration or {}
        return _json_response({"group": reg.get("wandb_group"), "project": reg.get("wandb_project"), "zmq_port": None})

    @router.get("/info")
    def info() -> JSONResponse:
        reg = api.registration
        if reg is None:
            return _json_response({"batch_size": -1, "max_token_len": -1})
        return _json_response({"batch_size": reg["batch_size"], "max_token_len": reg["max_token_len"]})

    @router.get("/batch")
    def batch(version: Optional[int] = None, max_staleness: Optional[int] = None,
              ack: Optional[int] = None, after: Optional[int] = None) -> Response:
        """One batch (oldest groups first) or {"batch": null}. `version`: the trainer's
        current weight version (remembered: it stamps pushes without one and bounds them);
        `max_staleness`: serve no group sampled more than this many versions before it.
        `ack`: at-least-once delivery: every batch up to `batch_id` `ack` is acknowledged
        (baton's trainer: the batches its newest checkpoint trained; 0: none yet), their
        groups marked served; a batch not acknowledged yet with a `batch_id` above `after`
        (default `ack`: the last batch the trainer holds) is served again (same `batch_id`,
        the oldest first) before a new one is formed. Without `ack` a batch is marked served
        in the transaction that encodes it (a batch that cannot be encoded stays queued).
        An `ack` or `after` for a batch never handed out is a 409 (nothing is marked); so is
        `after` without `ack`. Each group carries its `group_id` (the trainer's ledger)."""
        if after is not None and ack is None:
            raise HTTPException(409, "after= needs ack= (at-least-once delivery); nothing was marked")
        for name, v in (("version", version), ("max_staleness", max_staleness), ("ack", ack), ("after", after)):
            if v is not None and not -(2**63) <= v < 2**63:
                raise HTTPException(422, f"{name}: {v} is out of range")
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

        def encode(groups: list[dict[str, Any]] | None, stale: int, batch_id: int | None) -> bytes:
            body: dict[str, Any] = {"batch": groups}
            if stale:
                body["stale_groups"] = stale
            if batch_id is not None:
                body["batch_id"] = batch_id
            for g in groups or ():  # every ScoredData key present (null where absent)
                for k in SCORED_KEYS:
                    g.setdefault(k, None)
            return encode_json(body)

        try:
            raw = store.take_batch(reg["batch_size"], step, version, max_staleness, encode=encode, ack=ack,
                                   after=after)
        except AckError as exc:
            raise HTTPException(409, str(exc)) from None
        except (ValueError, UnicodeEncodeError) as exc:  # rows from before push-time checks: kept queued
            raise HTTPException(422, f"a queued group cannot be sent as JSON ({exc}); it stays queued") from None
        return Response(raw, media_type="application/json")

    @router.post("/ack")
    def ack_batches(ack: int) -> JSONResponse:
        """(baton) Acknowledge every batch up to `batch_id` `ack` (the trainer wrote the
        checkpoint that holds their update): their groups are never served again. A 409 for
        a batch never handed out (nothing is marked)."""
        if not 0 <= ack < 2**63:
            raise HTTPException(422, f"ack: {ack} is out of range")
        try:
            return _json_response({"acknowledged_groups": store.acknowledge(ack)})
        except AckError as exc:
            raise HTTPException(409, str(exc)) from None

    @router.get("/status")
    def status() -> JSONResponse:
        counts = store.counts()
        reg = api.registration or {}
        return _json_response({"current_step": store.get("current_step", 0), "queue_size": counts["queued_groups"],
                               **counts, "max_queue": api.max_queue, "trainer_version": api.trainer_version(),
                               "max_staleness": reg.get("max_staleness"), "batch_size": reg.get("batch_size", -1),
                               "group_size": reg.get("group_size"), "max_token_len": reg.get("max_token_len"),
                               "vocab_size": reg.get("vocab_size"), "registered": bool(reg), "started": bool(store.get("started", False)),
                               "envs": api.env_status()})

    @router.post("/reset_data")
    def reset_data(force: bool = False) -> PlainTextResponse:
        """Drop every group, environment and the registration. Refused while a trainer is
        registered unless `force=true` (one request must not wipe a running trainer's queue)."""
        if api.registration is not None and not force:
            counts = store.counts()
            raise HTTPException(409, f"a trainer is registered and {counts['queued_groups']} groups are queued: "
                                     f"POST /reset_data?force=true to drop them anyway")
        store.reset()
        return PlainTextResponse("Reset successful", status_code=200)

    return router


def env_routes(api: TrajectoryAPI, read: Any) -> APIRouter:
    """What an environment calls about itself: /register-env, /disconnect-env, /status-env
    (`read`: the app's body reader)."""
    router, store = APIRouter(), api.store

    @router.post("/register-env")
    async def register_env(request: Request) -> JSONResponse:
        return await run_in_threadpool(_register_env, await read(request))

    def _register_env(data: Any) -> JSONResponse:
        env = _parse(RegisterEnv, data, "register-env")
        reg = api.registration
        if reg is None or not store.get("started", False):
            return _json_response({"status": "wait for trainer to start"})
        if reg.get("group_size") and env.group_size != reg["group_size"]:
            raise HTTPException(409, f"group_size: this environment sends groups of {env.group_size}, the trainer "
                                     f"trains on groups of {reg['group_size']}")
        added = store.add_env(env.desired_name, env.max_token_length, env.weight if env.weight is not None else 1.0,
                              env.group_size, env.min_batch_allocation)
        return _json_response({"status": "success", "env_id": added["env_id"], "wandb_name": added["real_name"],
                               "checkpoint_dir": reg.get("checkpoint_dir", ""),
                               "starting_step": store.get("current_step", 0),
                               "checkpoint_interval": reg.get("save_checkpoint_interval", 0),
                               "num_steps": reg.get("num_steps", -1)})

    @router.post("/disconnect-env")
    async def disconnect_env(request: Request) -> JSONResponse:
        return await run_in_threadpool(_disconnect_env, await read(request))

    def _disconnect_env(data: Any) -> JSONResponse:
        env = _parse(EnvIdentifier, data)
        if not store.touch_env(env.env_id, connected=False):
            return _json_response({"status": "failure", "error": f"no env with id {env.env_id}"})
        return _json_response({"status": "success"})

    @router.get("/status-env")
    async def status_env(request: Request) -> JSONResponse:
        return await run_in_threadpool(_status_env, await read(request))

    def _status_env(data: Any) -> JSONResponse:
        env_req = _parse(EnvIdentifier, data)
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
        group_size = me["group_size"]  # every group it pushes has this size (check_env_group)
        reg = api.registration or {}
        return _json_response({
            "current_step": store.get("current_step", 0),
            "queue_size": sum(size for *_, size, _ in queued) // group_size,  # in groups, not sequences
            "self_queue_size": sum(size for _, env, size, _ in queued if env == me["env_id"]) // group_size,
            "env_weight": weight, "unallocated_fraction": 1.0 - min(min_alloc, 1.0),
            "max_group_size": max([1] + [size for _, _, size, _ in queued]),
            "max_queue": api.max_queue, "trainer_version": api.trainer_version(),
            "max_staleness": reg.get("max_staleness"), "batch_size": reg.get("batch_size", -1)})

    return router


def push_routes(api: TrajectoryAPI, max_body_bytes: int) -> APIRouter:
    """Scored groups in: /scored_data, /scored_data_list (at most PUSH_THREADS decoding at
    once), and /latest_example."""
    router, store = APIRouter(), api.store
    push_threads = anyio.CapacityLimiter(PUSH_THREADS)

    @router.get("/latest_example")
    def latest_example() -> JSONResponse:
        latest = store.latest()
        if latest is None:
            return _json_response({k: [] for k in ("tokens", "masks", "scores", "advantages", "ref_logprobs",
                                                   "generation_params", "inference_logprobs", "messages",
                                                   "images")})
        return _json_response(latest)

    async def push(request: Request, many: bool) -> tuple[int, int, int, list[dict[str, Any]]]:
        """(groups sent, queued, duplicates, rejections) of a /scored_data(_list) request."""
        key = request.headers.get("idempotency-key") or None
        if key is not None and len(key) > MAX_KEY_CHARS:
            raise HTTPException(400, f"Idempotency-Key is {len(key):,} characters; the limit is {MAX_KEY_CHARS} "
                                     f"(a fresh uuid4 hex per push is 32)")
        raw = await _read_body(request, max_body_bytes)
        return await anyio.to_thread.run_sync(_push, raw, key, many, limiter=push_threads)

    def _push(raw: bytes, key: str | None, many: bool) -> tuple[int, int, int, list[dict[str, Any]]]:
        if many and raw.lstrip()[:1] == b"[":
            items: Iterable[tuple[int, Any]] = enumerate(decode_json_array(raw))
        else:
            data = decode_json(raw)
            if not many and not isinstance(data, dict):
                raise HTTPException(422, f"expected one ScoredData object, got {type(data).__name__}")
            if many:
                raise HTTPException(422, f"expected a JSON array of ScoredData, got {type(data).__name__}")
            items = [(0, data)]
        return api.push(items, key, many)

    @router.post("/scored_data")
    async def scored_data(request: Request) -> JSONResponse:
        _, _, dup, rejected = await push(request, many=False)
        if rejected:
            raise HTTPException(rejected[0]["status"], rejected[0]["reason"])
        return _json_response({"status": "received", **({"duplicate": True} if dup else {})})

    @router.post("/scored_data_list")
    async def scored_data_list(request: Request) -> JSONResponse:
        sent, queued, dup, rejected = await push(request, many=True)
        if rejected:
            status = 409 if all(r["status"] == 409 for r in rejected) else 422
            raise HTTPException(status, {"message": f"{len(rejected)} of {sent} groups rejected; "
                                                    f"{queued} queued" + (f", {dup} already queued" if dup else ""),
                                         "queued": queued, "duplicates": dup, "rejected": rejected})
        return _json_response({"status": "received", "groups_processed": sent, **({"duplicates": dup} if dup else {})})

    return router


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
    ap.add_argument("--max-body-mb", type=float, default=MAX_BODY_BYTES / 2**20,
                    help="largest request body, plain or decompressed (413 beyond)")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    args.token = args.token or os.environ.get("BATON_API_TOKEN") or None
    return args


def api_main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = parse_api_args(argv)
    app = build_api_app(args.db, max_queue=args.max_queue, token=args.token, retry_after_s=args.retry_after_s,
                        env_timeout_s=args.env_timeout_s, max_body_bytes=int(args.max_body_mb * 2**20))
    sock = socket.create_server((args.host, args.port))
    counts = app.state.api.store.counts()
    print(f"baton api: http://{args.host}:{sock.getsockname()[1]} (db {args.db}: {counts['queued_groups']} groups "
          f"queued; token {'required' if args.token else 'OFF'})", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, **UVICORN_OPTIONS)).run(sockets=[sock])


if __name__ == "__main__":
    api_main()
