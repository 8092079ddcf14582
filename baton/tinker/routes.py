"""The `/api/v1/...` routes of `baton tinker`: the endpoints the official `tinker` SDK calls.

Calls that do work (create_model, forward(_backward), optim_step, save/load weights, asample)
check the request at once (a 4xx `{"detail": reason}` the SDK raises with that text), queue
the work and return a future (`baton.tinker.futures`); `retrieve_future` returns its result,
as protobuf when the SDK asks for it (forward_backward outputs, samples), else JSON. The rest
answer directly. An endpoint of the hosted service that is not served is a 404 naming the
feature (`REFUSED`), never a silent success.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response

from baton.protocol import SamplingParams
from baton.tinker import schemas as S
from baton.tinker import wire
from baton.tinker.futures import Futures, UserError
from baton.tinker.service import TinkerService

PROTO = "application/x-protobuf"
REFUSED = {  # endpoint -> the feature it serves on the hosted service
    "create_custom_loss": "server-side custom losses (forward_backward_custom runs client-side here)",
    "save_weights_external": "exporting weights to external storage",
    "copy_weights": "copying weights between models",
    "join_sampling_session": "joining a sampling session from another process",
    "retrieve_futures": "session-wide future polling",
    "cancel_future": "cancelling sampling requests",
    "auth/token": "JWT token exchange (use an API key)",
    "unload_model": "unloading models",
    "training_runs": "listing training runs and checkpoints",
}


def bad(message: str, status: int = 400) -> HTTPException:
    return HTTPException(status, message)


class Guard:
    """What the route groups share: the service, the futures, the sampler counter, and the
    checks that a session or a model exists (a 404 naming it otherwise)."""

    def __init__(self, svc: TinkerService, futures: Futures):
        self.svc, self.futures, self.counters = svc, futures, itertools.count()

    def session(self, session_id: str) -> None:
        if session_id not in self.svc.sessions:
            raise bad(f"unknown session_id {session_id!r} (create_session first)", 404)

    def trainee(self, model_id: str) -> None:
        if model_id not in self.svc.trainees:
            raise bad(f"unknown model_id {model_id!r}", 404)

    def future(self, kind: str, fn, seq: tuple[str, int] | None = None, **extra: Any) -> dict:
        return {"request_id": self.futures.submit(kind, fn, seq), **extra}


def add_routes(app: FastAPI, svc: TinkerService, futures: Futures) -> None:
    g = Guard(svc, futures)
    for group in (client_routes, model_routes, training_routes, checkpoint_routes, sampling_routes,
                  future_routes):  # future_routes last: its catch-all answers what no other route does
        group(app, g)


def client_routes(app: FastAPI, g: Guard) -> None:
    """Health, capabilities, the SDK's client config, sessions and telemetry."""
    svc = g.svc

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return {"supported_models": [{"model_name": svc.name, "max_context_length": svc.context_len,
                                      "trainable": True, "sampleable": True}]}

    @app.post("/api/v1/client/config")
    async def client_config():
        # plain httpx, API keys, forward_backward chunks in order, no compression, no server-side
        # custom losses, per-request future polling: what this server implements
        return {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "parallel_fwdbwd_chunks": False,
                "proto_compress_fwdbwd": False, "sample_use_retrieve_futures": False,
                "custom_loss_server_side": False, "sample_join_sampling_session": False,
                "sample_enable_stuck_detection": False}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return {"refresh_interval_sec": 3600, "sample_cancel_enabled": False}

    @app.post("/api/v1/create_session")
    async def create_session():
        return {"type": "create_session", "session_id": svc.new_session()}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(body: S.Session):
        g.session(body.session_id)
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish_session(session_id: str, body: S.FinishSession):
        g.session(session_id)  # the SDK's close() (the cookbook's train loops end with it); its models stay
        return {"type": "finish_session"}

    @app.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}  # the SDK's usage events: not kept


def model_routes(app: FastAPI, g: Guard) -> None:
    """Creating a LoRA model, and its info."""

    @app.post("/api/v1/create_model")
    async def create_model(body: S.CreateModel):
        g.session(body.session_id)
        targets = model_targets(body, g.svc)
        lc = body.lora_config
        model_id = f"{body.session_id}:train:{body.model_seq_id}"
        return g.future("create_model", lambda: g.svc.create_model(model_id, lc.rank, lc.seed, targets),
                        model_id=model_id)

    @app.post("/api/v1/get_info")
    async def get_info(body: S.ModelRef):
        g.trainee(body.model_id)
        return g.svc.info(body.model_id)


def training_routes(app: FastAPI, g: Guard) -> None:
    """forward(_backward) and optim_step."""
    svc = g.svc

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        req = await read_forward_backward(request)
        g.trainee(req.model_id)
        cfg = check_forward_backward(req, svc)
        kind = "forward" if req.forward_only else "forward_backward"
        seq = (req.model_id, req.seq_id) if req.seq_id else None  # the SDK numbers its requests from 1
        return g.future(kind, lambda: svc.forward_backward(req, cfg), seq, model_id=req.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(body: S.OptimStep):
        g.trainee(body.model_id)
        if body.optimizer_params is not None:
            raise bad(f"optimizer params of type {body.optimizer_params.get('type')!r} are not served "
                      "(AdamParams only)")
        adam = (body.adam_params or S.AdamParams()).model_dump()
        return g.future("optim_step", lambda: svc.optim_step(body.model_id, adam), in_order(body),
                        model_id=body.model_id)


def checkpoint_routes(app: FastAPI, g: Guard) -> None:
    """Saving weights (for a sampler, or a checkpoint) and loading them."""
    svc = g.svc

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(body: S.SaveForSampler):
        g.trainee(body.model_id)
        if body.kind != "snapshot":
            raise bad(f"sampling client kind {body.kind!r} is not served (snapshot only)")
        sampler_id = path = None
        if body.path is not None:
            path = checked(lambda: svc.checkpoint_path(body.model_id, "sampler_weights", body.path))
        else:
            sampler_id = f"{body.model_id.split(':')[0]}:sample:{next(g.counters)}"
        return g.future("save_weights_for_sampler", lambda: svc.save_for_sampler(body.model_id, path, sampler_id),
                        in_order(body), model_id=body.model_id)

    @app.post("/api/v1/save_weights")
    async def save_weights(body: S.SaveWeights):
        g.trainee(body.model_id)
        path = checked(lambda: svc.checkpoint_path(body.model_id, "weights", body.path))
        return g.future("save_weights", lambda: svc.save_state(body.model_id, path), in_order(body),
                        model_id=body.model_id)

    @app.post("/api/v1/load_weights")
    async def load_weights(body: S.LoadWeights):
        checked(lambda: svc.checkpoint_dir(body.path))
        if body.session_id is not None:  # create_training_client_from_state: a new model from the checkpoint
            g.session(body.session_id)
            model_id, create = f"{body.session_id}:train:{body.model_seq_id or 0}", True
        else:
            g.trainee(body.model_id or "")
            model_id, create = body.model_id, False
        return g.future("load_weights", lambda: svc.load_state(model_id, body.path, body.optimizer, create),
                        model_id=model_id)


def sampling_routes(app: FastAPI, g: Guard) -> None:
    """Sampling sessions, samplers, and asample."""
    svc = g.svc

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(body: S.CreateSamplingSession):
        g.session(body.session_id)
        if body.model_path is None:
            served_base(body.base_model, svc)
        else:
            checked(lambda: svc.checkpoint_dir(body.model_path))
        sampler_id = f"{body.session_id}:sample:{next(g.counters)}"
        # loading an adapter touches the engine: on the worker, in order with the training calls
        try:
            await g.futures.calls[g.futures.submit("open", lambda: svc.open_sampler(sampler_id, body.model_path))]
        except (UserError, ValueError) as e:
            raise bad(str(e)) from e
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        if sampler_id not in svc.sampler_sources:
            raise bad(f"unknown sampler {sampler_id!r}", 404)
        return {"sampler_id": sampler_id, "base_model": svc.name, "model_path": svc.sampler_sources[sampler_id][1]}

    @app.post("/api/v1/asample")
    async def asample(body: S.Sample):
        sampler_id = body.sampling_session_id
        if sampler_id is None or sampler_id not in svc.sampler_sources:
            raise bad("asample needs the sampling_session_id of a sampler created here "
                      "(create_sampling_client / save_weights_and_get_sampling_client)", 404)
        refuse_sample_options(body)
        prompt = prompt_tokens(body.prompt)
        params = sampling_params(body.sampling_params, len(prompt), svc)
        n = body.num_samples
        if n * params.max_new_tokens > 64 * svc.max_sample_tokens:
            raise bad(f"num_samples x max_tokens = {n * params.max_new_tokens} exceeds this server's bound of "
                      f"{64 * svc.max_sample_tokens} tokens per request")
        want_prompt = bool(body.prompt_logprobs)
        request_id = g.futures.submit("sample", lambda: svc.sample(sampler_id, prompt, n, params, want_prompt))
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}:{i}" for i in range(n)]}


def future_routes(app: FastAPI, g: Guard) -> None:
    """retrieve_future, and the catch-all: a 404 for every endpoint not served (registered last)."""
    futures = g.futures

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(body: S.Retrieve, request: Request):
        if not futures.known(body.request_id):
            raise bad(f"unknown request_id {body.request_id!r} (or its result is no longer kept)", 404)
        status, value = await futures.retrieve(body.request_id)
        if status == "try_again":
            return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
        if status == "error":
            return {"error": value[0], "category": value[1]}
        result = RESULTS.get(futures.kinds.get(body.request_id))
        return value if result is None else result(value, PROTO in request.headers.get("accept", ""))

    @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def refused(rest: str):
        feature = next((f for k, f in REFUSED.items() if rest == k or rest.startswith(k + "/")), None)
        if feature is not None:
            raise bad(f"baton tinker does not serve /api/v1/{rest}: {feature}", 404)
        raise bad(f"baton tinker has no endpoint /api/v1/{rest}", 404)


def in_order(body: Any) -> tuple[str, int] | None:
    """The (model_id, seq_id) a call runs in order by, when the SDK numbered it."""
    return (body.model_id, body.seq_id) if body.seq_id is not None else None


def served_base(base_model: str, svc: TinkerService) -> None:
    if base_model not in svc.names:
        raise bad(f"base_model {base_model!r} is not served here; this server serves "
                  f"{', '.join(map(repr, svc.names))}", 404)


def model_targets(body: S.CreateModel, svc: TinkerService) -> Any:
    """The LoRA target modules of a create_model request, after checking it asks for what is served."""
    served_base(body.base_model, svc)
    if body.lora_config is None:
        raise bad("full fine-tuning is not served by baton tinker: give a lora_config "
                  "(create_lora_training_client)")
    if body.optimizer_config.type != "adamw":
        raise bad(f"optimizer {body.optimizer_config.type!r} is not served (adamw only)")
    lc = body.lora_config
    try:
        from baton.tinker.trainee import lora_targets

        return lora_targets(lc.train_attn, lc.train_mlp, lc.train_unembed)
    except ValueError as e:
        raise bad(str(e)) from e


async def read_forward_backward(request: Request) -> wire.ForwardBackward:
    """A forward_backward request from its body: protobuf or JSON, uncompressed."""
    if request.headers.get("content-encoding"):
        raise bad(f"Content-Encoding {request.headers['content-encoding']!r} is not served (send the body "
                  "uncompressed)", 415)
    raw = await request.body()
    try:
        if PROTO in request.headers.get("content-type", ""):
            return wire.forward_backward_request(raw)
        return json_forward_backward(await request.json())
    except (wire.WireError, ValueError, KeyError, TypeError) as e:
        raise bad(f"malformed forward_backward request: {e}") from e


def check_forward_backward(req: wire.ForwardBackward, svc: TinkerService) -> Any:
    """The loss config of a forward_backward request, after checking its data fits the model."""
    if not req.data:
        raise bad("forward_backward: no data")
    too_long = [i for i, d in enumerate(req.data) if len(d.tokens) > svc.context_len]
    if too_long:
        raise bad(f"data[{too_long[0]}] has {len(req.data[too_long[0]].tokens)} tokens; the model takes "
                  f"at most {svc.context_len}")
    try:
        return svc.trainees[req.model_id].check(req.data, req.loss_fn, req.config)
    except ValueError as e:
        raise bad(str(e)) from e


NOT_SAMPLED = ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k", "target_prompt_logprobs",
               "prompt_logprobs_last_n", "record_stability_info")  # asample options of the hosted service only


def refuse_sample_options(body: S.Sample) -> None:
    for name in NOT_SAMPLED:
        if getattr(body, name):
            raise bad(f"{name} is not served by baton tinker")


def forward_backward_result(value: Any, proto: bool) -> Any:
    outputs, metrics = value
    if proto:
        return Response(wire.forward_backward_output(outputs, metrics), media_type=PROTO)
    return {"loss_fn_output_type": "ArrayRecord", "metrics": metrics,
            "loss_fn_outputs": [{k: tensor_json(v) for k, v in o.items()} for o in outputs]}


def sample_result(value: Any, proto: bool) -> Any:
    sequences, prompt_lp = value
    if proto:
        return Response(wire.sample_response(sequences, prompt_lp), media_type=PROTO)
    return {"sequences": [{"stop_reason": r, "tokens": t, "logprobs": lp} for r, t, lp in sequences],
            "prompt_logprobs": None if prompt_lp is None else [None if x != x else x for x in prompt_lp],
            "type": "sample"}


RESULTS = {  # a future's kind -> its result as the SDK reads it (protobuf when it accepts it); else the value itself
    "forward": forward_backward_result,
    "forward_backward": forward_backward_result,
    "sample": sample_result,
}


def checked(fn):
    try:
        return fn()
    except UserError as e:
        raise bad(str(e)) from e


def tensor_json(a: np.ndarray) -> dict:
    dtype = "int64" if a.dtype.kind in "iu" else "float32"
    return {"data": a.reshape(-1).tolist(), "dtype": dtype, "shape": list(a.shape)}


def prompt_tokens(model_input: S.ModelInput) -> list[int]:
    tokens: list[int] = []
    for chunk in model_input.chunks:
        if chunk.type != "encoded_text":
            raise bad(f"model_input chunks of type {chunk.type!r} are not served (token chunks only)")
        tokens.extend(chunk.tokens)
    if not tokens:
        raise bad("prompt is empty")
    return tokens


def sampling_params(p: S.SamplingParams, prompt_len: int, svc: TinkerService) -> SamplingParams:
    room = svc.context_len - prompt_len
    if room < 1:
        raise bad(f"prompt of {prompt_len} tokens leaves no room in the model's context of {svc.context_len}")
    max_tokens = p.max_tokens or min(room, svc.max_sample_tokens)
    if max_tokens > min(room, svc.max_sample_tokens):
        raise bad(f"max_tokens {max_tokens} exceeds {min(room, svc.max_sample_tokens)} (context left after the "
                  f"prompt, and --max-sample-tokens)")
    stop_strings: list[str] = []
    stop_ids: list[int] = []
    ignore_eos = False
    if isinstance(p.stop, str):
        stop_strings = [p.stop]
    elif isinstance(p.stop, list):
        if not p.stop:
            ignore_eos = True  # Tinker: [] disables every stop, EOS included
        elif all(isinstance(s, int) for s in p.stop):
            stop_ids = [int(s) for s in p.stop]
        else:
            stop_strings = [str(s) for s in p.stop]
    try:
        return SamplingParams(n=1, temperature=p.temperature, top_p=p.top_p, top_k=max(0, p.top_k),
                              max_new_tokens=max_tokens, seed=p.seed, stop=stop_strings, stop_token_ids=stop_ids,
                              ignore_eos=ignore_eos)
    except ValueError as e:
        raise bad(f"sampling_params: {e}") from e


def json_forward_backward(body: dict) -> wire.ForwardBackward:
    """The JSON form of a forward_backward request (what a client without protobuf sends):
    {"model_id", "seq_id", "forward_only", "forward_backward_input": {"data": [{"model_input":
    {"chunks": [{"tokens": [...]}]}, "loss_fn_inputs": {name: {"data", "dtype", "shape"}}}],
    "loss_fn", "loss_fn_config"}}."""
    fbi = body["forward_backward_input"]
    data = []
    for i, d in enumerate(fbi["data"]):
        tokens = prompt_tokens(S.ModelInput.model_validate(d["model_input"])) if d["model_input"]["chunks"] else []
        inputs = {}
        for k, t in d.get("loss_fn_inputs", {}).items():
            if t.get("dtype") not in ("int64", "float32"):
                raise ValueError(f"data[{i}].loss_fn_inputs[{k!r}]: dtype must be int64 or float32")
            inputs[k] = np.asarray(t["data"], dtype=t["dtype"]).reshape(t.get("shape") or [-1])
        data.append(wire.Datum(tokens, inputs))
    return wire.ForwardBackward(model_id=str(body["model_id"]), seq_id=int(body.get("seq_id") or 0),
                                loss_fn=str(fbi["loss_fn"]), forward_only=bool(body.get("forward_only", False)),
                                data=data, config=dict(fbi.get("loss_fn_config") or {}))
