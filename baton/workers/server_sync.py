"""The server-sync role: keeps `baton serve` processes on the trainer's weights.

Colocated with the actor (it reads the actor's `Policy` through `self.sibling("actor")`,
like the rollout role), it pushes the weights to every server after an update, tagged with
the policy version, through a `baton.sync` transport over HTTP, chosen by name (`rollout.weight_sync`, resolved
by `baton.sync.registry` for the placement "servers"):

    broadcast    (auto) `/init_weights_update_group` once, then per push
                 `/update_weights_from_distributed` + a torch.distributed broadcast (gloo on
                 CPU, NCCL on GPU) from this process
    checkpoint   a safetensors file written atomically to `weights_dir`, then
                 `/update_weights_from_disk` on every server (they must see the file, and
                 allow its directory: `baton serve --weights-dir`)

vLLM servers (`baton.rollout.vllm_engine.vllm_server_command`; recognised by their
/v1/models) are spoken to in the `vllm` dialect and take `checkpoint` only (what `auto` picks
when any server is vLLM): baton does not broadcast into vLLM's CUDA-only transfer engines.

Every server's version becomes the pushed version (its `/generate` answers carry it, so the
environments' groups do). `ensure(version)` asks each server for its version and re-pushes
when one differs (a restarted server comes back with its start-up weights); a push that
fails (a server gone mid-broadcast) waits for the servers to be healthy, rebuilds the
transport and pushes again, for up to `recover_s`. With `check=True` a push returns the
max |server - trainer| logprob on a probe prompt per server (the parity check).

`verify()` after a push: what the transport moved (sync/bytes, sync/seconds, sync/tensors)
and `sync/verified`: 1.0 when every server answers (`/weights_digest`, hashed there from its
model) the version pushed and, tensor for tensor, the digest of what was sent (a server that
holds another dtype, e.g. bf16 on a GPU: the digest of the trainer's tensor cast to it,
hashed during the push), else 0.0 with the first server and tensor that differ; NaN for a
server that cannot say (vLLM's).

Only rank 0 talks to the servers; with a sharded actor every rank takes part in gathering
the full tensors (`Policy.named_weights`).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Iterator

import torch

from baton.controller import Dispatch, Worker, register
from baton.data.records import prompt_ids
from baton.rollout.remote import RemoteEngine, detect_dialect
from baton.sync import build_transport, check_logprob_parity, resolve_weight_sync
from baton.sync.digest import tensor_digest
from baton.sync.group import dtype_name, parse_dtype
from baton.sync.verify import digests_held

log = logging.getLogger("baton.server_sync")


class ServerSyncWorker(Worker):
    """`ServerSyncWorker(servers, kind=, probe_prompt=, ...)`; see the module docstring."""

    def __init__(self, servers: list[str], *, kind: str = "auto", probe_prompt: str = "",
                 api_key: str | None = None, weights_dir: str | None = None, bucket_mb: float = 64.0,
                 recover_s: float = 300.0, ready_timeout_s: float = 300.0):
        super().__init__()
        self.requested = kind
        self.urls, self.kind, self.api_key = list(servers), resolve_weight_sync(kind, "servers"), api_key
        self.weights_dir, self.bucket_mb = weights_dir, bucket_mb
        self.recover_s, self.ready_timeout_s = recover_s, ready_timeout_s
        self.policy = self.sibling("actor").policy
        self.probe_ids = prompt_ids(self.policy.tokenizer, probe_prompt) if probe_prompt else []
        self.engines: list[RemoteEngine] = []
        self.sync: Any = None
        self.version: int | None = None  # last version every server confirmed
        self.repushes = 0
        self.held_dtypes: dict[str, dict[str, str]] = {}  # per server: {tensor: the dtype it holds}
        self.sent_dtypes: dict[str, str] = {}  # {tensor: dtype} of the last push
        self.casts: dict[tuple[str, str], str] = {}  # (tensor, a server's dtype): digest of the cast

    def _connect(self) -> None:
        if self.sync is not None:
            return
        self.engines = [RemoteEngine(u, dialect="baton", api_key=self.api_key) for u in self.urls]
        for e in self.engines:
            if not e.health():
                log.warning("waiting up to %.0f s for server %s to answer /health", self.ready_timeout_s, e.base_url)
            e.wait_ready(timeout=self.ready_timeout_s)
            e.dialect = detect_dialect(e.base_url, self.api_key)
        vllm = [e.base_url for e in self.engines if e.dialect == "vllm"]
        self.kind = resolve_weight_sync("checkpoint" if vllm and self.requested == "auto" else self.requested, "servers")
        if vllm and self.kind != "checkpoint":
            raise ValueError(f"rollout.weight_sync={self.kind!r} cannot reach the vLLM server(s) {vllm}: "
                             f"use checkpoint (or auto)")
        options = {"broadcast": dict(bucket_mb=self.bucket_mb, timeout_s=120.0, device=self.device),
                   "checkpoint": dict(directory=self.weights_dir)}.get(self.kind, {})
        self.sync = build_transport(self.kind, "servers", self.engines, **options)
        for e in self.engines:  # the dtypes each holds (nothing hashed): a cast's digest is taken while sending
            if e.dialect == "baton":
                try:
                    self.held_dtypes[e.base_url] = e.weights_digest(digests=False)["dtypes"]
                except Exception as exc:  # noqa: BLE001 - an older server: sync/verified is NaN
                    log.warning("server %s does not say what it holds (%s): sync/verified is not known",
                                e.base_url, str(exc)[:200])

    def _noted(self, weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """`weights`, with each tensor's dtype noted, and the digest of its cast to any other
        dtype a server holds it in (what that server holds after installing it)."""
        self.sent_dtypes, self.casts = {}, {}
        for name, t in weights:
            sent = self.sent_dtypes[name] = dtype_name(t.dtype)
            for held in {d[name] for d in self.held_dtypes.values() if d.get(name, sent) != sent}:
                self.casts[(name, held)] = tensor_digest(t.to(parse_dtype(held)))
            yield name, t

    def _reset(self) -> None:
        sync, self.sync = self.sync, None
        if sync is not None:
            try:
                sync.close()
            except Exception:  # noqa: BLE001 - a server may be gone; its group goes with it
                pass
        for e in self.engines:
            e.close()
        self.engines = []

    def _push_rank0(self, version: int, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        deadline = time.monotonic() + self.recover_s
        while True:
            try:
                self._connect()
                self.sync.push(weights, version)
                self.version = version
                return
            except ValueError:  # a transport that cannot reach these servers: no retry helps
                raise
            except Exception as exc:  # noqa: BLE001 - a server restarting; rebuild and push again
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not push weights version {version} to {self.urls} within "
                                       f"{self.recover_s:.0f} s: {exc}") from exc
                log.warning("weight push (version %d) to %s failed (%s: %s); reconnecting and pushing again",
                            version, self.urls, type(exc).__name__, str(exc)[:300])
                self._reset()
                self.repushes += 1
                time.sleep(1.0)
                weights = self._noted(iter(list(self.policy.named_weights())))  # unsharded: cheap to read again

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def push(self, version: int, check: bool = False) -> list[float] | None:
        """Make every server serve the actor's weights as `version`; with check, the max
        |server - trainer| logprob on the probe prompt per server."""
        weights = self.policy.named_weights()
        if self.rank != 0:
            for _ in weights:  # take part in the gather (sharded actors); rank 0 sends
                pass
            return None
        self._push_rank0(version, self._noted(weights))
        if not check:
            return None
        return [check_logprob_parity(e, self.policy.module, self.probe_ids, max_new_tokens=4) for e in self.engines]

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def ensure(self, version: int) -> int:
        """Re-push if a server does not serve `version` (it restarted); returns the number
        of servers that needed it (0 when all were in sync, or on ranks other than 0)."""
        if self.rank != 0 or not self.urls:
            return 0
        stale = []
        dialects = {e.base_url: e.dialect for e in self.engines}
        for url in self.urls:
            e = RemoteEngine(url, dialect=dialects.get(url.rstrip("/"), "baton"), api_key=self.api_key, timeout=10.0)
            try:
                served = e.served_version()
            except Exception:  # noqa: BLE001 - down: the next push or ensure finds out
                served = None
            finally:
                e.close()
            if served is not None and served != version:
                stale.append((url, served))
        if stale:
            log.warning("server(s) %s serve version(s) %s, not %d (restarted?): pushing the weights again",
                        [u for u, _ in stale], [v for _, v in stale], version)
            self._reset()
            self.repushes += 1
            self._push_rank0(version, self._noted(iter(list(self.policy.named_weights()))))
        return len(stale)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def verify(self) -> tuple[dict[str, float], str | None] | None:
        """After a push: ({sync/bytes, sync/seconds, sync/tensors, sync/verified}, the reason
        it is not 1.0 in one line, else None); None on ranks other than 0."""
        if self.rank != 0:
            return None
        verified, problem = self._verified()
        return {**(self.sync.last if self.sync is not None else {}), "sync/verified": verified}, problem

    def _verified(self) -> tuple[float, str | None]:
        """(1.0, None) when every server holds what was pushed; else (0.0, the first server that
        does not, in one line); (NaN, why) when none differs and one cannot say."""
        held = self.sync.held if self.sync is not None else None  # the broadcast's or checkpoint's `Held`
        if held is None or held.version is None:
            return 0.0, f"no push to {self.urls} was confirmed"
        unknown = None
        for e in self.engines:
            if e.base_url not in self.held_dtypes:
                unknown = unknown or f"server {e.base_url} does not say what it holds (no /weights_digest)"
                continue
            problem = self._server_differs(e, held.version, held.digests)
            if problem is not None:
                return 0.0, " ".join(problem.split())
        return (math.nan, unknown) if unknown else (1.0, None)

    def _server_differs(self, engine: RemoteEngine, version: int, pushed: dict[str, str]) -> str | None:
        """Why `engine` does not hold `pushed` (the digests of what was sent) as `version`, or None."""
        try:
            answer = engine.weights_digest()
        except Exception as exc:  # noqa: BLE001 - gone, asleep: it does not hold the push now
            return f"server {engine.base_url} did not say what it holds: {str(exc)[:300]}"
        served, dtypes, digests = answer.get("weight_version"), answer.get("dtypes") or {}, answer.get("digests") or {}
        if served != version:
            return f"server {engine.base_url} serves version {served}, not {version} as pushed"
        self.held_dtypes[engine.base_url] = dtypes
        want = {n: d if dtypes.get(n, self.sent_dtypes.get(n)) == self.sent_dtypes.get(n)
                else self.casts.get((n, dtypes[n]), "(cast not hashed)") for n, d in pushed.items()}
        ok, name = digests_held(digests, want)
        return None if ok else (f"server {engine.base_url} (version {served}) does not hold the weights pushed: "
                                f"tensor {name!r} digest {digests.get(name)} != {want[name]} sent")

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def close_sync(self) -> None:
        self._reset()
