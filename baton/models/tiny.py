"""Tiny causal-LM factory: Qwen2 / Llama / Qwen3-MoE / Mixtral models built from a config, never downloaded.

Presets cover the sizes baton's tests and demos need (parameter counts with the 260-token
byte vocabulary of `baton.models.tokenizer`, embeddings tied):

    "0.2m"   hidden 64, 4 layers    0.21M params  a smaller distillation student (BENCHMARKS.md)
    "0.75m"  hidden 128, 4 layers   0.82M params  unit tests, smoke runs
    "2m"     hidden 192, 5 layers   2.2M params
    "5m"     hidden 256, 6 layers   4.8M params
    "25m"    hidden 512, 8 layers   25.3M params  benchmarks
    "qwen3-moe" / "mixtral"  hidden 64, 2 layers, 4 experts of 128, top-2  mixture-of-experts tests

The mixture-of-experts families take `experts` (experts per layer), `top_k` (experts per
token) and `intermediate` (each expert's width); `_MOE_KEYS` maps them to each config's names.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, PretrainedConfig,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

from baton.models.presets import PRESETS  # the shapes (re-exported)

_FAMILIES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
             "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM), "mixtral": (MixtralConfig, MixtralForCausalLM)}
# the generic MoE shape keys -> each family's config names (`intermediate` is the expert's width)
_MOE_KEYS = {
    "qwen3_moe": {"experts": "num_experts", "top_k": "num_experts_per_tok", "intermediate": "moe_intermediate_size"},
    "mixtral": {"experts": "num_local_experts", "top_k": "num_experts_per_tok", "intermediate": "intermediate_size"},
}


def tiny_config(
    family: str = "qwen2",
    vocab_size: int = 260,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 384,
    max_position: int = 256,
    pad_token_id: int | None = 0,
    bos_token_id: int | None = 1,
    eos_token_id: int | None = 2,
    tie_word_embeddings: bool = True,
    **extra: Any,
) -> PretrainedConfig:
    """Return a small config of `family`. Special ids default to the char tokenizer's."""
    if family not in _FAMILIES:
        raise ValueError(f"unknown model family {family!r}; expected one of {sorted(_FAMILIES)}")
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"need hidden % heads == 0 and heads % kv_heads == 0, got {hidden}/{heads}/{kv_heads}")
    config_cls, _ = _FAMILIES[family]
    names = _MOE_KEYS.get(family, {})
    moe = {names[k]: extra.pop(k) for k in ("experts", "top_k") if k in extra and names}
    if set(extra) & {"experts", "top_k"}:
        raise ValueError(f"experts / top_k are shapes of a mixture-of-experts family ({', '.join(_MOE_KEYS)}), "
                         f"not of {family!r}")
    return config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden,
        **{names.get("intermediate", "intermediate_size"): intermediate},
        **moe,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        tie_word_embeddings=tie_word_embeddings,  # the embedding is most of a tiny model
        **extra,
    )


def build_tiny_model(
    preset: str | None = "0.75m",
    family: str = "qwen2",  # a preset with its own family (PRESETS) builds that one
    vocab_size: int = 260,
    seed: int = 0,
    verbose: bool = False,
    **overrides: Any,
) -> torch.nn.Module:
    """Build a randomly initialised causal LM from a preset (keys of PRESETS), with overrides.

    `overrides` are `tiny_config` arguments (hidden=..., layers=..., max_position=...).
    The init is seeded so the same call gives the same weights.
    """
    sizes: dict[str, Any] = {}
    if preset is not None:
        key = preset.lower()
        if key not in PRESETS:
            raise ValueError(f"unknown tiny preset {preset!r}; expected one of {list(PRESETS)}")
        sizes.update(PRESETS[key])
    family = str(sizes.pop("family", family))  # a MoE preset names its family
    sizes.update(overrides)
    config = tiny_config(family=family, vocab_size=vocab_size, **sizes)
    _, model_cls = _FAMILIES[family]
    with torch.random.fork_rng(devices=[]):  # seed the init without moving the caller's RNG
        torch.manual_seed(seed)
        model = model_cls(config)
    if verbose:
        print(f"tiny {family} preset={preset}: {count_params(model) / 1e6:.2f}M params")
    return model


def count_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())
