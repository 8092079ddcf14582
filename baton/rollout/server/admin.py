"""`baton serve`'s admin endpoints: weight updates (from disk, by broadcast), the weight
update group, LoRA adapters, sleep / wake. Off with --no-admin; JSON only, no cross-site
requests (`app.py` adds the guard as `admin_route`'s dependency)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import JSONResponse

from baton.http import error_body, guarded_router
from baton.rollout.server.guards import check_checkpoint, iter_handles, open_checkpoint, param_shapes
from baton.rollout.server.schemas import (I64_MAX, DestroyWeightsUpdateGroupRequest, InitWeightsUpdateGroupRequest,
                                          LoadLoraAdapterRequest, UnloadLoraAdapterRequest,
                                          UpdateWeightsFromDiskRequest, UpdateWeightsFromDistributedRequest, WeightsDigestRequest,
                                          errors)
from baton.sync.broadcast import AlreadyHasTrainer, validate_specs
from baton.sync.delta import StaleBase, check_base, installed_as
from baton.sync.digest import WeightDigestError, check_digests
from baton.sync.verify import held_report


def add_admin_routes(app: FastAPI, srv, admin_route: dict[str, Any]) -> None:
    """`srv`: the server's shared state (`state._Server`); `admin_route`: the
    route options (guard dependency, error responses) every admin endpoint takes."""
    for router in (weight_routes(srv, admin_route), lora_routes(srv, admin_route), memory_routes(srv, admin_route)):
        app.include_router(router)


def weight_routes(srv, admin_route: dict[str, Any]) -> APIRouter:
    """Weight updates from disk and by broadcast, and the broadcast's update group."""
    router, engine = guarded_router(), srv.engine

    @router.post("/update_weights_from_disk", **admin_route)
    async def update_from_disk(req: UpdateWeightsFromDiskRequest) -> Any:
        try:
            version = _weights_version(req, engine.version)
            files = srv.allow.files(req.model_path)
            async with srv.weight_update():
                with open_checkpoint(files) as handles:
                    # read and check everything off the engine thread (generation goes on), then install
                    await asyncio.to_thread(check_checkpoint, handles, param_shapes(engine))
                    if req.digests is not None:  # what the trainer sent, byte for byte, or refused
                        await asyncio.to_thread(check_digests, iter_handles(handles), req.digests)
                    check_base(engine, req.base_weights)  # a delta applies to the weights it was built on
                    await srv.runner.call(engine.update_weights, iter_handles(handles), version,
                                          label="update_weights_from_disk")
                    installed_as(engine, req.weights_id)
        except HTTPException as exc:
            return _fail(exc.status_code, f"update_weights_from_disk failed: {exc.detail}")
        except (WeightDigestError, StaleBase) as exc:
            return _fail(409, f"update_weights_from_disk refused: {exc}; still serving version {engine.version}")
        except (KeyError, ValueError) as exc:
            return _fail(400, f"update_weights_from_disk failed: {exc}; still serving version {engine.version}")
        srv.weights_path = str(files[0]) if len(files) == 1 else str(files[0].parent)
        return {"success": True, "message": f"loaded {req.model_path}", "version": engine.version,
                "num_paused_requests": 0}

    @router.post("/init_weights_update_group", dependencies=admin_route["dependencies"],
              responses={**admin_route["responses"], **errors(409)})
    async def init_group(req: InitWeightsUpdateGroupRequest) -> Any:
        if req.rank_offset >= req.world_size:
            return _fail(400, f"rank_offset ({req.rank_offset}) must be below world_size ({req.world_size})")
        backend = req.backend
        if backend == "auto":
            device = engine.device
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

    @router.post("/update_weights_from_distributed", **admin_route)
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
                                      req.shapes, version, req.group_name, bucket_bytes, req.digests,
                                      req.weights_id, req.base_weights, label="update_weights_from_distributed")
        except (WeightDigestError, StaleBase) as exc:
            return _fail(409, f"update_weights_from_distributed refused: {exc}; still serving version {engine.version}")
        except (KeyError, ValueError) as exc:
            return _fail(400, f"update_weights_from_distributed failed: {exc}")
        srv.weights_path = f"broadcast:{req.group_name}"
        return {"success": True, "message": f"received {len(req.names)} tensors", "version": engine.version}

    @router.post("/weights_digest", dependencies=admin_route["dependencies"],
                 responses={**admin_route["responses"], **errors(409)})
    async def weights_digest(req: WeightsDigestRequest) -> Any:
        """The version served and each tensor's dtype and digest, hashed here from the model
        (`baton.sync.verify.held_report`): a trainer checks the server holds what it pushed."""
        model = getattr(engine, "model", None)
        if not hasattr(model, "state_dict"):
            return _fail(400, "weights_digest: this engine's weights are not torch tensors in this process")
        async with srv.weights_lock:  # no update installs while the weights are read
            if engine.served_version() is None:
                return _fail(409, f"weights_digest: the weights are discarded (asleep) (version {engine.version})")
            version = engine.version
            report = await asyncio.to_thread(held_report, model, req.digests)
        return {"weight_version": version, **report}

    @router.post("/destroy_weights_update_group", **admin_route)
    async def destroy_group(req: DestroyWeightsUpdateGroupRequest) -> Any:
        try:
            srv.receiver.destroy_weights_update_group(req.group_name)
        except ValueError as exc:
            return _fail(400, str(exc))
        return {"success": True, "message": f"destroyed {req.group_name!r}"}
    return router


def lora_routes(srv, admin_route: dict[str, Any]) -> APIRouter:
    """LoRA adapters loaded and unloaded by name (also under vLLM's /v1/ paths)."""
    router, engine, model_name = guarded_router(), srv.engine, srv.model_name

    @router.post("/load_lora_adapter", **admin_route)
    @router.post("/v1/load_lora_adapter", **admin_route, include_in_schema=False)
    async def load_lora(req: LoadLoraAdapterRequest) -> Any:
        if req.lora_name == model_name:
            return _fail(400, f"lora_name {req.lora_name!r} is the base model's name")
        try:
            files = srv.allow.files(req.lora_path)  # the adapter dir must lie inside --weights-dir
            from baton.models.lora import read_adapter

            adapter = await asyncio.to_thread(read_adapter, files[0].parent)
            if req.digests is not None:  # what the trainer wrote, byte for byte, or refused
                await asyncio.to_thread(check_digests, adapter[1].items(), req.digests)
            async with srv.weight_update():
                nbytes = await srv.runner.call(engine.load_lora_adapter, req.lora_name, adapter,
                                               label="load_lora_adapter")
        except HTTPException as exc:
            return _fail(exc.status_code, f"load_lora_adapter failed: {exc.detail}")
        except WeightDigestError as exc:
            return _fail(409, f"load_lora_adapter refused: {exc}; still serving the adapter loaded before, if any")
        except (KeyError, ValueError, FileNotFoundError, AttributeError) as exc:
            return _fail(400, f"load_lora_adapter failed: {exc}")
        srv.lora_paths[req.lora_name] = req.lora_path
        return {"success": True, "message": f"LoRA adapter {req.lora_name!r} added ({nbytes} bytes)",
                "loaded_adapters": dict(srv.lora_paths)}

    @router.post("/unload_lora_adapter", **admin_route)
    @router.post("/v1/unload_lora_adapter", **admin_route, include_in_schema=False)
    async def unload_lora(req: UnloadLoraAdapterRequest) -> Any:
        try:
            await srv.runner.call(engine.unload_lora_adapter, req.lora_name, label="unload_lora_adapter")
        except (KeyError, AttributeError) as exc:
            return _fail(400, f"unload_lora_adapter failed: {exc}")
        srv.lora_paths.pop(req.lora_name, None)
        return {"success": True, "message": f"LoRA adapter {req.lora_name!r} removed",
                "loaded_adapters": dict(srv.lora_paths)}
    return router


def memory_routes(srv, admin_route: dict[str, Any]) -> APIRouter:
    """Sleep (release the engine's memory) and wake."""
    router, engine = guarded_router(), srv.engine

    @router.post("/release_memory_occupation", **admin_route)
    async def release_memory() -> dict:
        async with srv.batcher.paused():  # running generations finish first
            await srv.runner.call(engine.sleep, label="sleep")
        srv.asleep = True
        return {"success": True, "message": "asleep"}

    @router.post("/resume_memory_occupation", **admin_route)
    async def resume_memory() -> dict:
        await srv.runner.call(engine.wake, label="wake")
        srv.asleep = False
        return {"success": True, "message": "awake"}
    return router


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
    """SGLang's failure shape, with OpenAI's `error` for clients that read that."""
    return JSONResponse({"success": False, "message": message, "detail": message, **error_body(status, message)},
                        status_code=status)
