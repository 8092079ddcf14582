"""The engine protocol every rollout engine speaks (embedded, HTTP-remote, vLLM/SGLang).

It sits at the bottom of the package (`baton.rollout` implements it, `baton.sync` pushes
weights through it, `baton.envs` evaluates through it), so none of those import each other.

    generate(prompts: list of token-id lists, params) -> flat list of Completion,
        prompt-major: the n samples of prompt 0, then of prompt 1, ... (the same order as
        `Batch.repeat(n, interleave=True)`).
    update_weights(iterator of (name, tensor), version) -> None
    sleep() / wake(): release and restore memory (KV cache; weights when colocated)
    version: the policy version of the weights now loaded

The optional members (what some engines offer: an in-process module, a server's address, LoRA
adapters, a KV budget, loading a checkpoint directory) are declared on `Engine` with the value
an engine that lacks them has (None, empty, False). An engine class subclasses `Engine` to
inherit them and overrides what it offers, so callers read `engine.device` or test
`engine.update_weights_from_disk is not None` instead of probing with getattr / hasattr.

Logprob convention: `Completion.logprobs[t]` is log_softmax(logits / temperature) of the
chosen token (temperature 0 -> greedy, logprobs at temperature 1), taken *before*
top-k / top-p / min-p filtering (but after a `grammar`'s mask: baton.rollout.constrained). The trainer computes its logprobs the same way, so the PPO
ratio of an unchanged policy is exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # annotations only: tasks and reward worker processes import this without torch
    import torch


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    max_new_tokens: int = 64
    stop_token_ids: list[int] = field(default_factory=list)  # in addition to the EOS id(s)
    stop: list[str] = field(default_factory=list)  # stop strings (needs a tokenizer)
    seed: int | None = None
    ignore_eos: bool = False
    # a LoRA adapter the engine serves by name (baton serve / vLLM / SGLang load_lora_adapter);
    # None: the engine's own weights (a colocated LoRA policy: its live adapter)
    lora: str | None = None
    # structured outputs: a Lark grammar (llguidance's dialect, `baton.rollout.grammars`) every
    # completion must match; enforced by masking the logits before sampling, and the logprobs
    # are then the masked distribution's (baton.rollout.constrained). None: unconstrained.
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_new_tokens < 1 or not 0 <= self.min_p <= 1:
            raise ValueError("top_k must be >= 0, max_new_tokens >= 1, min_p in [0, 1]")


# a constrained row whose grammar allowed nothing more before it was complete (ended with EOS,
# its text does not match): never "stop" (`baton.rollout.constrained`)
GRAMMAR_ERROR = "grammar_error"


@dataclass
class Completion:
    prompt_index: int  # index into the prompts passed to generate
    token_ids: list[int]  # generated tokens, including the stop token if one ended it
    logprobs: list[float]  # one per generated token (see the convention above)
    finish_reason: str  # "stop" (EOS / stop id / stop string), "length", or GRAMMAR_ERROR
    version: int  # policy version that produced it
    # with the engine's `record_routing` (a mixture of experts on the fast path): the experts
    # each token was produced by, [tokens, MoE layers, top-k] long (routing replay, baton.models.moe)
    routing: Any = None


@runtime_checkable
class Engine(Protocol):
    version: int

    # --- optional: the value an engine that does not offer the member has ---------------
    model: Any = None  # the torch module it runs in this process (None: its weights live elsewhere)
    device: Any = None  # the torch.device its weights live on (None: not in this process)
    base_url: str | None = None  # an HTTP engine's server (None: in process)
    max_model_len: int | None = None  # a cap of its own on prompt + generated tokens
    eos_token_ids: Sequence[int] = ()  # the ids that end a completion (empty: the tokenizer's EOS)
    structured_outputs: bool = False  # enforces SamplingParams.grammar
    adapters: Mapping[str, Any] = MappingProxyType({})  # the LoRA adapters it serves, by name
    # (KV tokens, a row's sampling memory in tokens) a call may hold now
    batch_budget: Callable[[], tuple[int, int]] | None = None
    # a server: loads a safetensors file (path, version, digests=...) after checking it
    update_weights_from_disk: Callable[..., None] | None = None
    dialect: str | None = None  # an HTTP engine's server kind: "baton", "vllm" or "sglang" (None: in process)
    # installs a subset of the tensors (a delta sync, `baton.sync.delta`); vLLM and SGLang take whole sets
    partial_weight_updates: bool = True
    weights_id: str | None = None  # the identity of the whole set of weights last installed (baton.sync.delta)

    def served_version(self) -> int | None:
        """The weight version it serves now (a server is asked)."""
        return self.version

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]: ...

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


class EngineClass(Protocol):
    """What a class registered in `baton.rollout.engines.ENGINES` provides (the class object
    itself: `build` is a classmethod). `shares_module`: True when the engine reads the
    trainer's module (the colocated sync is `inplace`), False when it holds its own copy
    that weights are pushed into (`copy`)."""

    shares_module: bool

    def build(self, module: Any, tokenizer: Any, *, model_path: str | None = None, **options: Any) -> Engine: ...
