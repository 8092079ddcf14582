"""The JSON request bodies of the Tinker API as the SDK (`tinker` 0.38) sends them: the fields
baton reads, typed (a wrong type is a 422 naming the field). Fields the SDK sends for the
hosted service's bookkeeping (user_metadata, tags, project ids, ttl) are accepted and have no
effect here; fields that would change a result and are not served (top-k logprobs, prompt
alternatives, inflight samplers, ...) are refused by the routes with a 400 naming them.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class LoraConfig(Body):
    rank: int = Field(ge=1, le=1024)
    seed: Optional[int] = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class OptimizerConfig(Body):
    type: str = "adamw"


class CreateModel(Body):
    session_id: str
    model_seq_id: int = 0
    base_model: str
    lora_config: Optional[LoraConfig] = None
    optimizer_config: OptimizerConfig = OptimizerConfig()


class FinishSession(Body):
    reason: dict[str, Any]  # {"type": "success" | "errored" | "interrupted"}
    detail: Optional[str] = None


class ModelRef(Body):
    model_id: str


class AdamParams(Body):
    model_config = ConfigDict(extra="forbid")
    learning_rate: float = Field(default=1e-4, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-12, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip_norm: float = Field(default=0.0, ge=0)


class OptimStep(Body):
    model_id: str
    seq_id: Optional[int] = None
    adam_params: Optional[AdamParams] = None
    optimizer_params: Optional[dict[str, Any]] = None


class SaveForSampler(Body):
    model_id: str
    path: Optional[str] = None
    sampling_session_seq_id: Optional[int] = None
    kind: str = "snapshot"
    seq_id: Optional[int] = None


class SaveWeights(Body):
    model_id: str
    path: Optional[str] = None
    seq_id: Optional[int] = None


class LoadWeights(Body):
    model_id: Optional[str] = None
    seq_id: Optional[int] = None
    session_id: Optional[str] = None
    model_seq_id: Optional[int] = None
    path: str
    optimizer: bool


class CreateSamplingSession(Body):
    session_id: str
    sampling_session_seq_id: int = 0
    model_path: Optional[str] = None
    base_model: Optional[str] = None


class Chunk(Body):
    type: str = "encoded_text"
    tokens: list[int] = []


class ModelInput(Body):
    chunks: list[Chunk]


class SamplingParams(Body):
    max_tokens: Optional[int] = Field(default=None, ge=1)
    seed: Optional[int] = None
    stop: Union[str, list[int], list[str], None] = None
    temperature: float = Field(default=1.0, ge=0)
    top_k: int = -1
    top_p: float = Field(default=1.0, gt=0, le=1)


class Sample(Body):
    num_samples: int = Field(default=1, ge=1)
    prompt: ModelInput
    sampling_params: SamplingParams
    base_model: Optional[str] = None
    model_path: Optional[str] = None
    sampling_session_id: Optional[str] = None
    prompt_logprobs: Optional[bool] = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: Optional[Any] = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: Optional[int] = None
    record_stability_info: Optional[bool] = None


class Retrieve(Body):
    request_id: str


class Session(Body):
    session_id: str
