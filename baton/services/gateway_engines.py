"""The engines behind the OpenAI gateway (`baton.services.gateway`): what samples one
session turn, token ids in and token ids out, with behaviour logprobs and the weights version.

    InProcessEngine(engine)            an engine in this process (the embedded engine, a vLLM
                                       engine); concurrent turns batched by the server's batcher
    HttpEngine("http://127.0.0.1:8001") a `baton serve` (or SGLang) server, through /generate

Both have `async sample(ids, params, on_progress=None) -> Sampled`; only InProcessEngine
reports tokens as they come (a gateway stream over HttpEngine arrives at the end). An engine's refusal of a request is the
agent's 4xx; an engine that fails is a 502 (HttpEngine raises the HTTPException itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import HTTPException

from baton.rollout.server.batcher import Batcher, EngineRunner
from baton.protocol import SamplingParams


@dataclass
class Sampled:
    """One engine call's output for one prompt."""
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    version: int


class InProcessEngine:
    """An `Engine` in this process; concurrent sessions' turns with equal sampling
    parameters share one `generate` call (the server's batcher)."""

    def __init__(self, engine: Any, max_batch_wait_ms: float = 2.0, max_batch_seqs: int = 256):
        self.engine = engine
        self.structured_outputs = engine.structured_outputs  # SamplingParams.grammar
        self._args = (max_batch_wait_ms, max_batch_seqs)
        self._batcher: Batcher | None = None

    async def sample(self, ids: list[int], params: SamplingParams, on_progress: Any = None) -> Sampled:
        """on_progress: a stream's listener for the tokens of each slice (`Batcher.submit`)."""
        if self._batcher is None:  # bound to the serving event loop
            self._batcher = Batcher(EngineRunner(self.engine), max_wait_ms=self._args[0], max_batch_seqs=self._args[1])
        c = (await self._batcher.submit([ids], params, on_progress))[0]
        return Sampled(list(c.token_ids), [float(x) for x in c.logprobs], c.finish_reason, int(c.version))


class HttpEngine:
    """A `baton serve` (or SGLang) server, token in / token out through /generate."""

    structured_outputs = True  # a grammar goes as /generate's `grammar`; the server refuses it if it cannot

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)

    async def sample(self, ids: list[int], params: SamplingParams, on_progress: Any = None) -> Sampled:
        """on_progress is not called: /generate answers whole (a stream gets it at the end)."""
        sp = {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
              "top_k": params.top_k or -1, "min_p": params.min_p, "stop": params.stop or None,
              "stop_token_ids": params.stop_token_ids or None, "ignore_eos": params.ignore_eos}
        if params.seed is not None:
            sp["sampling_seed"] = params.seed
        if params.grammar is not None:
            sp["grammar"] = params.grammar
        r = await self.client.post("/generate", json={"input_ids": ids, "sampling_params": sp, "return_logprob": True})
        if r.status_code != 200:
            raise HTTPException(r.status_code if 400 <= r.status_code < 500 else 502, f"engine: {_reason(r)}")
        out = r.json()
        meta = out["meta_info"]
        lps = [float(x[0]) for x in meta["output_token_logprobs"]]
        return Sampled(list(out["output_ids"]), lps, meta["finish_reason"]["type"], int(meta["weight_version"]))


def _reason(r: httpx.Response) -> str:
    """The message of an error answer (OpenAI's `error.message`, else the text)."""
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text
