"""Request bodies of `baton serve` (pydantic): OpenAI, SGLang-style /generate, weight updates.

Type errors and out-of-range values are rejected by pydantic with a 422 that names the
field; sampling options baton does not implement (penalties, SGLang's ebnf, ...)
are accepted only at their neutral values and otherwise rejected with a 400 by
`unsupported()`, so a client never silently gets different sampling than it asked for.
Unknown top-level keys are ignored (OpenAI clients send many); unknown keys inside
/generate's `sampling_params` are rejected, since a typo there would silently change sampling.
Floats must be finite and integers stay within what torch and the sync code take (seeds
in int64/uint64, versions in int64, ...); limits that depend on the served model (context
length, token ids, the per-request token cap) are checked by the server itself.

`ERRORS` / `errors(...)` describe the error responses for the OpenAPI schema (`responses=`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Stop = str | list[str] | None


I64_MAX = 2**63 - 1


def _seed() -> Any:
    return Field(None, ge=-(2**63), le=2**64 - 1)  # what torch.Generator.manual_seed takes


def _version() -> Any:
    return Field(None, ge=0, le=I64_MAX)


MAX_TOP_LOGPROBS = 20  # alternatives per position: OpenAI's and vLLM's bound


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape (baton.http.error_body)."""
    error: ErrorInfo


class WeightUpdateFailure(BaseModel):
    success: Literal[False] = False
    message: str
    detail: str
    error: ErrorInfo


ERRORS: dict[int, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Impossible request; `error.message` says why"},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key (`Authorization: Bearer <key>`)"},
    403: {"model": ErrorResponse, "description": "Admin endpoints disabled, or weights path outside the allow-list"},
    404: {"model": ErrorResponse, "description": "Unknown `model`; `error.message` lists the served names"},
    409: {"model": WeightUpdateFailure, "description": "The server already has a trainer (weight update group)"},
    413: {"model": ErrorResponse, "description": "Request body too large (--max-body-mb, --max-generate-body-mb)"},
    415: {"model": ErrorResponse, "description": "Admin endpoints take only application/json"},
    499: {"description": "The client disconnected; its generation was dropped or cancelled"},
    503: {"model": ErrorResponse, "description": "The engine is asleep (release_memory_occupation)"},
}


def errors(*codes: int, weights: bool = False) -> dict[int, dict[str, Any]]:
    """OpenAPI `responses=` for a route that may answer `codes` (weight routes answer
    400 with `WeightUpdateFailure`)."""
    out = {c: dict(ERRORS[c]) for c in codes}
    if weights and 400 in out:
        out[400]["model"] = WeightUpdateFailure
    return out


class _SamplingExtras(_Lenient):
    """vLLM / SGLang extensions accepted by both OpenAI endpoints."""
    top_k: int = Field(-1, ge=-1)  # -1 or 0: off
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stream: bool = False
    return_tokens_as_token_ids: bool = False  # vLLM: logprob tokens as "token_id:<id>"
    return_token_ids: bool = False  # vLLM: choices[i].token_ids / prompt_token_ids


class CompletionRequest(_SamplingExtras):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=1024)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    stop: Stop = None
    seed: int | None = _seed()
    echo: bool = False
    stream_options: dict[str, Any] | None = None  # {"include_usage": bool}
    best_of: int | None = None
    suffix: str | None = None
    response_format: Any = None  # json_object / json_schema: constrained decoding (server/structured.py)


class ChatMessage(_Lenient):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # assistant: OpenAI tool calls (baton.rollout.server.tools)
    tool_call_id: str | None = None  # tool: the call it answers
    name: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:  # OpenAI content parts: only text is understood here
            if part.get("type") != "text":
                raise ValueError(f"unsupported content part type {part.get('type')!r} (text only)")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class ChatCompletionRequest(_SamplingExtras):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=1024)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    stop: Stop = None
    seed: int | None = _seed()
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None  # "auto" | "none" | "required" | {"type": "function", ...} (tools.check_tools)
    stream_options: dict[str, Any] | None = None  # {"include_usage": bool}
    response_format: Any = None  # json_object / json_schema: constrained decoding (server/structured.py)


class GenerateSamplingParams(BaseModel):
    """SGLang's sampling_params names (`max_new_tokens`, `top_k=-1` off, `sampling_seed`)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    n: int = Field(1, ge=1, le=1024)
    stop: Stop = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = _seed()
    sampling_seed: int | None = _seed()
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    min_new_tokens: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    json_schema: str | None = None  # constrained decoding (server/structured.py)
    regex: str | None = None
    ebnf: str | None = None  # refused: SGLang's EBNF dialect is not llguidance's Lark
    grammar: str | None = None  # baton: a Lark grammar, llguidance's dialect (baton.rollout.grammars)


class GenerateRequest(_Lenient):
    text: str | list[str] | None = None
    lora_path: str | list[str | None] | None = None  # SGLang: the adapter (by name) per request
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    return_logprob: bool = False
    stream: bool = False
    rid: str | list[str] | None = None


class UpdateWeightsFromDiskRequest(_Lenient):
    model_path: str
    load_format: str | None = None
    version: int | None = _version()  # baton: the new policy version (default: current + 1)
    weight_version: str | int | None = None  # SGLang's name; must parse as an int here
    flush_cache: bool = True
    abort_all_requests: bool = False
    # baton: {tensor name: digest} of what the trainer sent (baton.sync.digest); checked before
    # the weights are installed: a mismatch is refused naming the tensor, the old version kept
    digests: dict[str, str] | None = None
    # baton: the identity of the whole set of weights after this push (baton.sync.delta), and the
    # one a delta is built on: refused (409) unless the server holds exactly that
    weights_id: str | None = Field(None, max_length=64)
    base_weights: str | None = Field(None, max_length=64)


class InitWeightsUpdateGroupRequest(_Lenient):
    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1, le=65535)
    world_size: int = Field(ge=2, le=65536)
    group_name: str = "weight_update_group"
    backend: Literal["gloo", "nccl", "auto"] = "auto"  # auto: nccl if the engine is on CUDA
    timeout_s: float = Field(600.0, gt=0, le=86400)


class UpdateWeightsFromDistributedRequest(_Lenient):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    version: int | None = _version()
    weight_version: str | int | None = None
    # baton extension: tensors arrive packed in flat buckets of this many bytes (see
    # baton.sync.group.plan_buckets); absent -> one broadcast per tensor, as SGLang does.
    bucket_bytes: int | None = Field(None, ge=0, le=2**40)
    digests: dict[str, str] | None = None  # baton: as UpdateWeightsFromDiskRequest's, checked before installing
    weights_id: str | None = Field(None, max_length=64)  # baton: as UpdateWeightsFromDiskRequest's
    base_weights: str | None = Field(None, max_length=64)
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False


class WeightsDigestRequest(BaseModel):
    """baton: what the server holds now, by content (`sync/verified` on the API path)."""
    model_config = ConfigDict(extra="forbid")
    digests: bool = True  # False: only the version and each tensor's dtype (nothing hashed)


class DestroyWeightsUpdateGroupRequest(_Lenient):
    group_name: str = "weight_update_group"


class LoadLoraAdapterRequest(_Lenient):
    """vLLM's and SGLang's shape: a PEFT adapter dir, served as `lora_name`."""
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str
    load_inplace: bool = False  # vLLM: replace a loaded adapter of that name (baton always does)
    pinned: bool = False  # SGLang: keep it resident (baton keeps every adapter resident)
    digests: dict[str, str] | None = None  # baton: {PEFT key: digest} sent, checked before it is served


class UnloadLoraAdapterRequest(_Lenient):
    lora_name: str = Field(min_length=1, max_length=256)


def unsupported(req: BaseModel, top_logprobs_why: str | None = "it returns the chosen token's logprob only") \
        -> str | None:
    """The first option set to a value baton cannot honour, as a reason string.
    `top_logprobs_why`: why logprobs / top_logprobs above 1 cannot be given (None: they can)."""
    neutral = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
               "echo": False, "suffix": None, "min_new_tokens": 0, "ebnf": None}
    for name, value in neutral.items():
        if name in type(req).model_fields and getattr(req, name) != value:
            return f"{name}={getattr(req, name)!r} is not supported by baton serve"
    for name in ("logprobs", "top_logprobs"):
        value = getattr(req, name, None)
        if top_logprobs_why and isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return f"{name}={value} is not supported here: {top_logprobs_why} (use {name}=1)"
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != getattr(req, "n", 1):
        return "best_of != n is not supported by baton serve"
    return None


def stop_list(stop: Stop) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)
