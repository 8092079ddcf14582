"""`EmbeddedEngine`: an in-process rollout engine over an HF causal LM (pure PyTorch).

It implements `baton.protocol.Engine`. Colocated training hands it the trainer's
own `nn.Module`: the engine reads its parameters afresh at the start of every `generate`
(the fast path's fused weights are rebuilt then; nothing is cached across calls), so after
an optimizer step the next `generate` already samples from the new policy. Generations in
flight together (`start_generation`) share one fused copy, dropped once none is in flight
or the weights are updated: `baton serve`'s 8 interleaved generations hold one copy, not 8.

How a `generate` call runs:
  1. prompts are sorted by length and cut into groups whose KV cache
     (rows * n * (prompt_len + max_new_tokens) tokens) fits the call's budget: a fixed
     `max_batch_tokens`, else a `memory_fraction` of the memory free when the call starts
     (`kv_budget.py`), so on a large GPU a step's groups decode as one;
  2. each group is left-padded and prefilled once per prompt; the cache is then copied to
     the prompt's n sample rows;
  3. a decode loop samples one token per row per step, records tokens and logprobs, and
     marks rows that hit EOS / a stop id / a stop string; once enough rows have finished
     the batch is compacted so finished rows stop costing compute. On a GPU the decode step
     runs as a CUDA graph over static buckets (`static_decode.py`, captured once per bucket
     and kept across calls) and the host looks at the finished rows, and matches stop
     strings over the tokens since its last look, every `sync_every` steps: one read per
     look, none in between.
`generate(..., should_stop=f)` calls `f()` before each prefill and decode step and raises
`GenerationCancelled` once it returns True (a server drops work nobody waits for).
`start_generation(...)` returns the same call as a `Generation` to run k steps at a time
(`advance(k)`), its KV cache put aside in between: `baton serve` interleaves a long
request with short ones this way, each getting the tokens it would get alone.
Llama, Qwen2, Qwen3, Mistral and the Qwen3-MoE / Mixtral mixtures of experts (their expert
layers: `moe.py`) use the fast runner in `llama.py` (`llama.FAMILIES`);
every other model runs through its own HF forward (`hf.py`). `SamplingParams.grammar`
(structured outputs) masks the logits before each sample (`baton.rollout.constrained`,
llguidance); the host then looks every step.

LoRA: a peft model (a colocated LoRA policy) runs on the fast path over its base weights
with its *live* adapter tensors applied at each `generate` (nothing merged, nothing copied,
so an optimizer step on the adapters is seen by the next call); `load_lora_adapter(name,
dir)` adds PEFT-format adapters that a request selects with `SamplingParams.lora = name`
(vLLM / SGLang's multi-LoRA serving, the base weights shared).

Weights pushed in (`update_weights`) and `sleep` / `wake`: `residency.py` (`Residency`).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable

import torch
from torch import nn

from baton.padding import pad_left
from baton.rollout.embedded import llama
from baton.rollout.embedded.hf import HFRunner
from baton.rollout.embedded.llama import LlamaRunner
from baton.protocol import Completion, Engine, SamplingParams
from baton.rollout.embedded.sampling import draw, sample
from baton.rollout.embedded.generation import Generation
from baton.rollout.embedded.kv_budget import (MEMORY_FRACTION, check_budget_options, free_memory, group_prompts,
                                     kv_bytes_per_token, token_budget)
from baton.rollout.embedded.live_lora import live_lora
from baton.rollout.embedded.residency import SLEEP_MODES, Residency
from baton.rollout.embedded.static_decode import STEPS, DecodeGraphs, StaticDecoder
from baton.rollout.embedded.stop_strings import StopStringMatcher

PEFT_PREFIX = "base_model.model."  # PEFT's key prefix in adapter_model.safetensors

SYNC_EVERY_GPU = 8  # decode steps between the host's looks at finished rows on a GPU


class GenerationCancelled(RuntimeError):
    """`generate` stopped early because its `should_stop` callable returned True."""


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple, set)) else [int(value)]


def _per_layer(log: list[torch.Tensor], layers: int) -> torch.Tensor:
    """The runner's routing log (per chunk, each MoE layer's [rows, K] in order) as [rows, layers, K]."""
    chunks = [torch.stack(log[i:i + layers], dim=1) for i in range(0, len(log), layers)]
    return torch.cat(chunks) if len(chunks) > 1 else chunks[0]


class EmbeddedEngine(Residency, Engine):
    """Rollout engine that runs inside the calling process.

    sleep_mode: what `sleep()` frees. "cache": only the KV cache (the default, and the only
    sensible one for a colocated trainer module, whose weights the trainer still needs);
    "offload": also moves the weights to CPU (back on `wake()`); "discard": also frees the
    weight storage - `wake()` re-allocates it uninitialised and the next `update_weights`
    must refill every parameter before `generate`. A "discard" engine owns its module (a copy
    the trainer pushes weights into): on the fast path it lays each layer's Q, K, V (gate, up)
    back to back (`llama.fuse_storage`) when built and again on each `wake()` (which brings the
    storage back one parameter at a time), so each group is one matmul with no packed copy.

    max_batch_tokens: a fixed KV-cache budget (tokens) per group; memory_fraction: the share
    of the free memory a call's KV cache and sampling may take (`baton.rollout.embedded.kv_budget`).
    At most one; neither: memory_fraction MEMORY_FRACTION.

    static_decode: decode through `baton.rollout.embedded.static_decode` (bucket-sized static buffers,
    each bucket's step a CUDA graph on a GPU; on a GPU, prompts prefilled in one pass).
    None (the default): on a GPU with the fast path, off on a CPU; True: on, its step
    "graph" (run eagerly as "fixed" on a CPU); "fixed": eagerly on a GPU too. False: off.
    sync_every: the host checks for finished rows every this many steps (one read each); None:
    every step on a CPU (syncs are free there, and the compactions fall where they always
    did), every SYNC_EVERY_GPU steps on a GPU. A finished row's later tokens are cut off, so
    a larger value moves only the batch's compactions (greedy tokens do not change; sampled
    ones do, as a row's random draw depends on its place in the batch). Stop strings, which
    the host matches, are checked at the same looks, over the tokens since the last one (a
    row is cut where its text first held one, whichever look found it); a grammar's mask
    needs the host every step.
    record_routing: each Completion's `routing`, the experts every sampled token was produced by
    at each MoE layer ([tokens, layers, K]; routing replay, `baton.models.moe`): a mixture of
    experts on the fast path; decodes with the runner's own step (static decode off).
    """

    shares_module = True  # reads the module it is given: colocated sync is `inplace` (baton.rollout.engines)
    structured_outputs = True  # enforces SamplingParams.grammar (baton.rollout.constrained)

    @classmethod
    def build(cls, module: nn.Module, tokenizer: Any, *, model_path: str | None = None, **options: Any) -> "EmbeddedEngine":
        """The registry's constructor (`baton.rollout.engines`): the module itself, no load."""
        return cls(module, tokenizer, **options)

    def __init__(self, model: nn.Module, tokenizer: Any = None, *,
                 eos_token_ids: int | list[int] | None = None, pad_token_id: int | None = None,
                 version: int = 0, max_batch_tokens: int | None = None, memory_fraction: float | None = None,
                 fast: bool = True,
                 fuse_weights: bool = True, sleep_mode: str = "cache", static_decode: bool | str | None = None,
                 sync_every: int | None = None, record_routing: bool = False):
        if sleep_mode not in SLEEP_MODES:
            raise ValueError(f"sleep_mode must be one of {SLEEP_MODES}, got {sleep_mode!r}")
        if sync_every is not None and sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.model = model
        self.tokenizer = tokenizer
        self.version = version
        check_budget_options(max_batch_tokens, memory_fraction)
        self.max_batch_tokens = max_batch_tokens
        self.memory_fraction = MEMORY_FRACTION if memory_fraction is None else memory_fraction
        self.last_budget: int | None = None  # the KV tokens the last call's groups were cut by
        self.sleep_mode = sleep_mode
        if eos_token_ids is None:
            gen_cfg = getattr(model, "generation_config", None)
            eos_token_ids = getattr(gen_cfg, "eos_token_id", None)
            if eos_token_ids is None:
                eos_token_ids = getattr(getattr(model, "config", None), "eos_token_id", None)
            if eos_token_ids is None and tokenizer is not None:
                eos_token_ids = tokenizer.eos_token_id
        self.eos_token_ids = _as_id_list(eos_token_ids)
        if pad_token_id is None and tokenizer is not None:
            pad_token_id = tokenizer.pad_token_id
        # any id works for padding (it is masked); fall back to EOS, then 0
        self.pad_token_id = pad_token_id if pad_token_id is not None else (self.eos_token_ids or [0])[0]
        self._peft = hasattr(model, "peft_config") and hasattr(model, "get_base_model")
        base = model.get_base_model() if self._peft else model
        self.runner = (LlamaRunner(base, fuse=fuse_weights) if fast and llama.supports(base)
                       else HFRunner(model))
        if static_decode not in (None, True, False, *STEPS):
            raise ValueError(f"static_decode must be None, a bool or one of {STEPS}, got {static_decode!r}")
        if static_decode and not isinstance(self.runner, LlamaRunner):
            raise ValueError("static_decode needs the fast decoder path (fast=True and a plain "
                             f"{' / '.join(llama.FAMILIES)} model); {type(base).__name__} runs through its HF forward")
        self.static_decode, self.sync_every = static_decode, sync_every
        if record_routing and not getattr(self.runner, "moe_layers", 0):
            raise ValueError("recording the experts of each token (rollout.routing_replay) needs a mixture of experts "
                             f"on the fast path ({', '.join(llama.FAMILIES)}); {type(base).__name__} is not one")
        self.record_routing = record_routing  # each Completion's `routing` (decoded by the runner's own step)
        self.graphs = DecodeGraphs()  # static decode's buffers and CUDA graphs, kept across calls
        self.adapters: dict[str, llama.Lora] = {}  # served LoRA adapters by name
        self._asleep = False
        self._device = None  # the weights' device while offloaded
        self._discarded: list[tuple[torch.Tensor, torch.Size]] = []  # (param, shape) while discarded
        self._missing: dict[int, str] = {}  # id(param) -> name: still to refill after a discard
        self._in_flight: weakref.WeakSet[Generation] = weakref.WeakSet()  # started, not ended
        self._lay_out()

    # --- properties --------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- generate ----------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 should_stop: Callable[[], bool] | None = None) -> list[Completion]:
        """should_stop: polled before each decode step; True -> `GenerationCancelled`."""
        gen = self.start_generation(prompts, params, should_stop)
        gen.advance()
        return gen.result

    def start_generation(self, prompts: list[list[int]], params: SamplingParams,
                         should_stop: Callable[[], bool] | None = None) -> "Generation":
        """A `generate` call to run a few decode steps at a time (`Generation.advance`),
        other generations running in between (how `baton serve` interleaves requests).
        Bad requests raise here, before anything runs."""
        if self._asleep:
            raise RuntimeError("engine is asleep: call wake() before generate()")
        if self._missing:
            raise RuntimeError(f"{len(self._missing)} parameters were discarded by sleep() and not "
                               f"refilled by update_weights, e.g. {next(iter(self._missing.values()))!r}")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        if params.grammar is not None:
            from baton.rollout.constrained import check_grammar  # llguidance: the `structured` extra

            check_grammar(params.grammar)
        live: dict[str, Any] = {}  # what `Generation.partial` reads between slices (streaming)
        gen = Generation(self, self._steps(prompts, params, should_stop, live), live)
        self._in_flight.add(gen)
        return gen

    def generation_ended(self, gen: Generation) -> None:
        """`gen` finished, failed or was closed: once none is in flight, the fused weights
        they shared are dropped (a colocated trainer's next step changes them in place)."""
        self._in_flight.discard(gen)
        if not self._in_flight:
            self.runner.unpack()

    def _steps(self, prompts: list[list[int]], params: SamplingParams,
               should_stop: Callable[[], bool] | None, live: dict[str, Any] | None = None):
        """The generation as a Python generator: yields after each prefill / decode step,
        returns the completions. Runs inside `Generation.advance` (inference mode, eval).
        `live` is kept current: `results`, `n`, the running `group`, its buffers and step."""
        results: list[list[Completion]] = [[] for _ in prompts]
        live = {} if live is None else live
        live.update(results=results, n=params.n)
        self.runner.pack(self._lora_for(params), reuse=len(self._in_flight) > 1)  # shared with those in flight
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        for group in self._groups(prompts, params):
            live.update(group=group, t=0, buffers=None)
            comps_by_prompt = yield from self._generate_group([prompts[i] for i in group], params, generator,
                                                              should_stop, live)
            for i, comps in zip(group, comps_by_prompt):
                for c in comps:
                    c.prompt_index = i
                results[i] = comps
        return [c for comps in results for c in comps]

    def batch_budget(self) -> tuple[int, int]:
        """(KV tokens, a row's sampling memory in tokens) a call may hold now: the fixed
        `max_batch_tokens`, else `memory_fraction` of the free memory (after the weights)."""
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens, 0
        cfg = self.model.config
        kv_bytes = kv_bytes_per_token(cfg, self._dtype())
        if self._static_step(self.device):  # the prefill's cache and the arena it is copied into
            kv_bytes *= 2
        return token_budget(free_memory(self.device) + self.graphs.idle_bytes(), self.memory_fraction,
                            kv_bytes, cfg.vocab_size)

    def _groups(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Prompt indices, by length, cut so each group's KV cache fits the budget."""
        budget, row_tokens = self.batch_budget()
        self.last_budget = budget  # what the last call sized its groups by (benches, metrics)
        return group_prompts([len(p) for p in prompts], params.n, params.max_new_tokens, budget, row_tokens)

    def _generate_group(self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator | None,
                        should_stop: Callable[[], bool] | None = None, live: dict[str, Any] | None = None):
        """Generator: yields after the prefill and after each decode step; returns the
        group's completions, per prompt. `live` gets the token buffers and the step count."""
        if should_stop is not None and should_stop():  # before this group's prefill
            raise GenerationCancelled("generation cancelled before prefill")
        device, n, max_new = self.device, params.n, params.max_new_tokens
        B = len(prompts)
        ids, mask = pad_left(prompts, self.pad_token_id)  # [B, P] left-padded, [B, P]
        ids, mask = ids.to(device), mask.to(device)
        static, on_gpu = self._static_step(device), device.type == "cuda"

        record = self.record_routing
        if record:
            self.runner.route_log = []
        logits = self.runner.start(ids, mask, max_new, n, one_pass=True) if static and on_gpu \
            else self.runner.start(ids, mask, max_new, n)  # [B, V]
        if record:  # the experts the first sampled tokens come from: [B * n, MoE layers, K]
            live = {} if live is None else live
            live["routes"] = _per_layer(self.runner.route_log, self.runner.moe_layers).repeat_interleave(n, 0)
            self.runner.route_log.clear()
        yield
        if n > 1:
            logits = logits.repeat_interleave(n, 0)  # [B * n, V]
        rows = B * n
        # the static step samples too (inside its graph) unless a grammar masks the logits first
        fused = params if static and params.grammar is None else None
        decoder = StaticDecoder(self.runner, rows, static, self.graphs, fused) if static else self.runner
        try:
            return (yield from self._decode(decoder, logits, params, generator, should_stop, live, B))
        finally:
            if record:
                self.runner.route_log = None
            if static:
                decoder.close()  # its arena (and graphs) back to the engine, for the next group

    def _decode(self, decoder, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                should_stop: Callable[[], bool] | None, live: dict[str, Any] | None, B: int):
        """The decode loop of `_generate_group` (a generator, as it is)."""
        device, n, max_new, on_gpu = self.device, params.n, params.max_new_tokens, self.device.type == "cuda"
        rows = B * n
        stop_ids = _as_id_list(params.stop_token_ids) + ([] if params.ignore_eos else self.eos_token_ids)
        stop_ids_t = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device)
        out_tokens = torch.zeros(rows, max_new, dtype=torch.long, device=device)  # [rows, max_new]
        out_logprobs = torch.zeros(rows, max_new, dtype=torch.float32, device=device)
        texts = StopStringMatcher(self.tokenizer, params.stop, rows) if params.stop else None
        guide = self._guide(params, logits.shape[-1], rows)  # a grammar's per-row state (None: no grammar)
        stops = stop_ids_t.numel() > 0 or texts is not None or guide is not None
        hits = torch.zeros(rows, max_new, dtype=torch.bool, device=device) if stops else None  # a stop at [row, t]
        alive = torch.arange(rows, device=device)  # batch row -> group row
        alive_list = list(range(rows))
        done = torch.zeros(rows, dtype=torch.bool, device=device)  # [b] batch rows that stopped
        # the host looks every `every` steps (one read: the finished rows, and with stop strings
        # the tokens since its last look); a grammar masks each step's logits, so it looks each step
        every = 1 if guide is not None else self.sync_every or (SYNC_EVERY_GPU if on_gpu else 1)
        checked = 0  # steps whose tokens the stop strings have seen
        fused_step = getattr(decoder, "sampling", None) is not None  # a StaticDecoder that samples
        sampled = None  # (tokens, logprobs) the last step sampled
        routes = None  # [rows, max_new, MoE layers, K]: the experts each sampled token came from
        if live is not None:
            live["buffers"] = (out_tokens, hits)
            first = live.pop("routes", None)
            if first is not None:
                routes = first.new_full((rows, max_new, *first.shape[1:]), -1)
                routes[:, 0] = first

        for t in range(max_new):
            if should_stop is not None and should_stop():
                raise GenerationCancelled(f"generation cancelled after {t} of {max_new} steps")
            if guide is not None:
                logits = guide.mask(logits, alive_list)  # [b, V] -inf where the grammar forbids
            if sampled is None:
                tokens, logprobs = sample(logits, params, generator)  # [b], [b]
            else:
                tokens, logprobs = sampled  # the step sampled them
            out_tokens[alive, t] = tokens
            out_logprobs[alive, t] = logprobs
            if stops:
                hit = torch.isin(tokens, stop_ids_t)  # [b]
                if guide is not None:
                    hit |= guide.advance(alive_list, tokens.tolist()).to(device)
                hits[alive, t] = hit
                done |= hit
            # a look every `every` steps; at the last step only for stop strings (to cut the rows)
            last = t == max_new - 1
            look = stops and (texts is not None if last else (t + 1) % every == 0)
            done_list = self._look(done, out_tokens, hits, alive, alive_list, texts, checked, t) if look else None
            checked = t + 1 if look else checked
            if live is not None:  # tokens recorded so far (with stop strings: only those they have seen)
                live["t"] = checked if texts is not None else t + 1
            if last:
                break
            if look:
                n_done = sum(done_list)
                if n_done == len(alive_list):
                    break
                if n_done and n_done * 8 >= len(alive_list):  # compact: finished rows stop costing compute
                    keep_list = [j for j, d in enumerate(done_list) if not d]
                    keep = torch.tensor(keep_list, dtype=torch.long, device=device)  # [b']
                    decoder.select(keep)
                    tokens, alive, done = tokens[keep], alive[keep], done[keep]
                    alive_list = [alive_list[j] for j in keep_list]
            if fused_step:  # the same draws `sample` takes, handed to the step
                sampled = decoder.decode(tokens, draw(len(alive_list), params, generator, device))
            else:
                logits = decoder.decode(tokens)  # [b, V]
            if routes is not None:  # this step's experts produced the tokens of step t + 1
                routes[alive, t + 1] = _per_layer(self.runner.route_log, self.runner.moe_layers)
                self.runner.route_log.clear()
            yield
        return self._completions(out_tokens, out_logprobs, hits, B, n, guide, routes)

    @staticmethod
    def _look(done: torch.Tensor, out_tokens: torch.Tensor, hits: torch.Tensor, alive: torch.Tensor,
              alive_list: list[int], texts: StopStringMatcher | None, checked: int, t: int) -> list[bool]:
        """The host's look at step t, one read: which batch rows have finished (done [b], in
        place); with stop strings, their tokens of steps checked..t first, a row whose text now
        holds one marked at the step where it first did (hits [rows, T])."""
        if texts is None:
            return done.tolist()
        block = torch.cat([out_tokens[alive, checked:t + 1], done[:, None].long()], 1).tolist()  # [b, k + 1]
        first = texts.push_block(alive_list, [row[:-1] for row in block])
        found = [(j, checked + at) for j, at in enumerate(first) if at is not None]
        if found:
            js, ts = zip(*found)
            hits[alive[list(js)], list(ts)] = True
            done[list(js)] = True
        found_rows = {j for j, _ in found}
        return [bool(row[-1]) or j in found_rows for j, row in enumerate(block)]

    def _guide(self, params: SamplingParams, vocab: int, rows: int) -> Any:
        if params.grammar is None:
            return None
        from baton.rollout.constrained import Guide  # llguidance: the `structured` extra

        return Guide(params.grammar, self.tokenizer, vocab, self.eos_token_ids, rows)

    def _completions(self, out_tokens: torch.Tensor, out_logprobs: torch.Tensor, hits: torch.Tensor | None,
                     B: int, n: int, guide: Any = None,
                     routes: torch.Tensor | None = None) -> list[list[Completion]]:
        """Per prompt, its n completions: each row cut after its first stop (hits [rows, T],
        None: no stop conditions), from out_tokens / out_logprobs [rows, T]; a grammar's
        (`guide`) failed row has finish reason GRAMMAR_ERROR."""
        rows, max_new = out_tokens.shape
        if hits is None:
            lengths, stopped = [max_new] * rows, [False] * rows
        else:
            stopped_t = hits.any(-1)  # [rows]
            first = hits.int().argmax(-1)  # [rows] the first stop (argmax: first of the maxima)
            lengths, stopped = torch.where(stopped_t, first + 1, max_new).tolist(), stopped_t.tolist()
        tok_rows, lp_rows = out_tokens.tolist(), out_logprobs.tolist()
        per_prompt: list[list[Completion]] = [[] for _ in range(B)]
        for r in range(rows):
            L = lengths[r]
            per_prompt[r // n].append(Completion(
                prompt_index=r // n, token_ids=tok_rows[r][:L], logprobs=lp_rows[r][:L],
                finish_reason=guide.finish_reason(r, stopped[r]) if guide is not None else
                "stop" if stopped[r] else "length", version=self.version,
                routing=None if routes is None else routes[r, :L].cpu()))
        return per_prompt

    def _static_step(self, device: torch.device) -> str | None:
        """The `StaticDecoder` step this call decodes with; None: the runner's own decode."""
        if self.record_routing:  # the runner's own decode logs each step's experts
            return None
        if self.static_decode is None:
            return "graph" if isinstance(self.runner, LlamaRunner) and device.type == "cuda" else None
        if self.static_decode is True:
            return "graph"
        return self.static_decode or None

    # --- LoRA ---------------------------------------------------------------------------
    def _lora_for(self, params: SamplingParams) -> llama.Lora | None:
        """The adapter a call runs with: a served one by name, else a peft model's live one
        (the HF runner applies a peft model's adapters in its own forward)."""
        if params.lora is not None:
            if params.lora not in self.adapters:
                raise KeyError(f"unknown LoRA adapter {params.lora!r}; loaded: {sorted(self.adapters)}")
            return self.adapters[params.lora]
        if self._peft and isinstance(self.runner, LlamaRunner):
            return live_lora(self.model)
        return None

    def load_lora_adapter(self, name: str, source) -> int:
        """Serve a PEFT adapter as `name` (replacing one of that name): `source` is a PEFT
        adapter dir, or (its adapter_config.json dict, {PEFT key: tensor}). Every tensor is
        checked (a linear of this model, shapes, finite) before any is installed. Returns
        the bytes of its tensors."""
        if isinstance(source, (str, os.PathLike)):
            from baton.models.lora import read_adapter
            source = read_adapter(source)
        config, tensors = source
        if not isinstance(self.runner, LlamaRunner):
            raise ValueError("LoRA adapters are served on the fast decoder path only (model_type one of "
                             f"{', '.join(llama.FAMILIES)}); this model runs through its HF forward")
        if config.get("rank_pattern") or config.get("alpha_pattern"):
            raise ValueError("per-module LoRA ranks / alphas (rank_pattern, alpha_pattern) are not supported")
        r, alpha = int(config["r"]), float(config["lora_alpha"])
        scale = alpha / (r ** 0.5) if config.get("use_rslora") else alpha / r
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            path, _, kind = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
            if kind not in ("A.weight", "B.weight"):
                raise ValueError(f"unexpected adapter tensor {key!r}")
            pairs.setdefault(path, {})[kind[0]] = t
        known = self._linear_shapes()
        adapter: llama.Lora = {}
        for path, ab in pairs.items():
            if path not in known or set(ab) != {"A", "B"}:
                raise ValueError(f"adapter tensor for {path!r}: not a linear of this model, or A/B missing")
            out_f, in_f = known[path]
            A, B = ab["A"], ab["B"]
            if A.shape != (r, in_f) or B.shape != (out_f, r):
                raise ValueError(f"{path}: adapter shapes A {tuple(A.shape)}, B {tuple(B.shape)} do not fit "
                                 f"[{r}, {in_f}] / [{out_f}, {r}]")
            if not (torch.isfinite(A).all() and torch.isfinite(B).all()):
                raise ValueError(f"{path}: adapter tensors are not finite")
            adapter[path] = (A.to(self.device, self._dtype()), B.to(self.device, self._dtype()), scale)
        self.adapters[name] = adapter
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b, _ in adapter.values())

    def unload_lora_adapter(self, name: str) -> None:
        if self.adapters.pop(name, None) is None:
            raise KeyError(f"no LoRA adapter {name!r} is loaded; loaded: {sorted(self.adapters)}")

    def _dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _linear_shapes(self) -> dict[str, tuple[int, int]]:
        base = self.model.get_base_model() if self._peft else self.model
        return {name: tuple(llama._base(m).weight.shape) for name, m in base.named_modules()
                if isinstance(llama._base(m), nn.Linear)}
