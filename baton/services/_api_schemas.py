"""The trajectory API's request shapes (Atropos's, with bounds SQLite and an embedding can
hold) and the checks a pushed group passes: its own consistency (`check_group`), the
trainer's registration (`check_against`), the registered environment's group size
(`check_env_group`), JSON-encodable values (`check_encodable`)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field

Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, Field(ge=1, le=2**31 - 1)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
MaskId = Annotated[int, Field(ge=-100, le=2**31 - 1)]
SCORED_KEYS = ("tokens", "masks", "scores", "advantages", "ref_logprobs", "messages", "generation_params",
               "inference_logprobs", "overrides", "group_overrides", "images", "env_id")


class Registration(BaseModel):
    model_config = ConfigDict(extra="ignore")
    wandb_group: str = ""
    wandb_project: str = ""
    batch_size: Count
    max_token_len: Count
    checkpoint_dir: str = ""
    save_checkpoint_interval: Int64 = 0
    starting_step: Int64 = 0
    num_steps: Int64 = -1
    max_staleness: Optional[Int64] = None  # baton: refuse pushes older than this many versions
    group_size: Optional[Count] = None  # baton: every pushed group must have exactly this many sequences
    vocab_size: Optional[Count] = None  # baton: every token id must be below it


# Settings a second registration must repeat (a reconnecting trainer) or be refused, naming both values.
FIXED_SETTINGS = ("batch_size", "max_token_len", "group_size", "vocab_size")


class RegisterEnv(BaseModel):
    model_config = ConfigDict(extra="ignore")
    max_token_length: Count
    desired_name: str
    weight: float = 1.0
    group_size: Count
    min_batch_allocation: Optional[float] = None


class EnvIdentifier(BaseModel):
    model_config = ConfigDict(extra="ignore")
    env_id: Int64


class ScoredData(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[list[TokenId]]
    masks: list[list[MaskId]]
    scores: list[float]
    advantages: Optional[list[list[float]]] = None
    ref_logprobs: Optional[list[list[float]]] = None
    messages: Optional[list[list[dict[str, Any]]]] = None
    generation_params: Optional[dict[str, Any]] = None
    inference_logprobs: Optional[list[list[float]]] = None
    overrides: Optional[list[dict]] = None
    group_overrides: Optional[dict] = None
    images: Optional[Any] = None
    env_id: Optional[Int64] = None
    # baton's additions (ignored by Atropos trainers):
    policy_version: Optional[Int64] = None  # the weight version that sampled the group
    finish_reasons: Optional[list[str]] = None  # "stop" | "length" per sequence


def check_group(g: ScoredData) -> str | None:
    """Why a group cannot be trained on, or None."""
    n = len(g.tokens)
    if n == 0:
        return "tokens is empty (a group needs at least one sequence)"
    if len(g.masks) != n or len(g.scores) != n:
        return f"tokens, masks and scores must have one entry per sequence (got {n}, {len(g.masks)}, {len(g.scores)})"
    for i, (t, m) in enumerate(zip(g.tokens, g.masks)):
        if not t:
            return f"sequence {i}: tokens is empty"
        if len(m) != len(t):
            return f"sequence {i}: masks has {len(m)} entries for {len(t)} tokens"
        for j, (tok, mk) in enumerate(zip(t, m)):
            if mk != -100 and mk != tok:
                return (f"sequence {i}, position {j}: mask {mk} is neither -100 (not trained) nor the token "
                        f"id {tok} (trained)")
    for i, s in enumerate(g.scores):
        if not math.isfinite(s):
            return f"sequence {i}: score {s} is not finite"
    for name in ("inference_logprobs", "ref_logprobs", "advantages"):
        v = getattr(g, name)
        if v is None or v == []:
            continue
        if len(v) != n or any(len(a) != len(t) for a, t in zip(v, g.tokens)):
            return f"{name} must be aligned to tokens (one list per sequence, one value per token)"
        for i, row in enumerate(v):
            for j, x in enumerate(row):
                if not math.isfinite(x):
                    return (f"{name}: sequence {i}, position {j}: {x} is not finite (JSON cannot carry it to the "
                            f"trainer; clamp it, e.g. -inf logprobs to -1e4)")
    for name in ("overrides", "finish_reasons"):
        v = getattr(g, name)
        if v not in (None, []) and len(v) != n:
            return f"{name} must have one entry per sequence (got {len(v)} for {n})"
    return None


def check_against(g: ScoredData, reg: dict[str, Any]) -> str | None:
    """Why a well-formed group cannot be trained on by the registered trainer, or None."""
    n = len(g.tokens)
    if reg.get("batch_size") and n > reg["batch_size"]:
        return f"group of {n} sequences can never fit a batch of {reg['batch_size']}"
    if reg.get("group_size") and n != reg["group_size"]:
        return f"group_size: the group has {n} sequences, the trainer's group_size is {reg['group_size']}"
    limit, vocab = reg.get("max_token_len"), reg.get("vocab_size")
    for i, t in enumerate(g.tokens):
        if limit and len(t) > limit:
            return f"sequence {i}: {len(t)} tokens, past the trainer's max_token_len={limit}"
        if vocab and max(t) >= vocab:
            return f"sequence {i}: token id {max(t)} is not below the trainer's vocab_size={vocab}"
    return None


def check_env_group(g: ScoredData, env: dict[str, Any] | None) -> str | None:
    """Why a group cannot come from the registered environment `env` (None: no such env), or None."""
    if env is None or len(g.tokens) == env["group_size"]:
        return None
    return (f"group_size: the group has {len(g.tokens)} sequences, environment {env['real_name']!r} (env_id "
            f"{env['env_id']}) registered group_size {env['group_size']}")


def encode_json(body: Any) -> bytes:
    """`body` as the response bytes (ValueError for NaN/inf, UnicodeEncodeError for a lone surrogate)."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def check_encodable(body: Any) -> str | None:
    """Why `body` could not be sent back as JSON (checked at push, so a batch never fails to encode)."""
    try:
        encode_json(body)
    except UnicodeEncodeError as exc:
        return f"a string holds a lone surrogate ({exc.reason}): not valid UTF-8"
    except ValueError as exc:
        return f"a value is not valid JSON ({exc}): non-finite numbers cannot be served"
    return None


def group_version(g: ScoredData) -> int | None:
    if g.policy_version is not None:
        return g.policy_version
    v = (g.group_overrides or {}).get("policy_version")
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
