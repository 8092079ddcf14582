"""Rollout engines by name (`rollout.engine`): the registry every place that builds an engine uses.

    embedded  baton's own pure-PyTorch engine (`baton.rollout.embedded.engine.EmbeddedEngine`): reads
              the trainer's module in place; no dependency beyond torch (the default)
    vllm      vLLM in the calling process (`baton.rollout.vllm_engine.VLLMEngine`): its own
              copy of the weights, loaded from the model's directory, kept in sync by `copy`

    engine = build_engine("embedded", module, tokenizer, model_path=cfg.model.path, fuse_weights=False)

Entries are lazy "module:attribute" entries of a `baton.registry.Registry`, imported on first
lookup, so vLLM is imported only when asked for. Each engine class is a
`baton.protocol.EngineClass`: `build(module, tokenizer, *, model_path, **options)` and
`shares_module` (True: the engine reads the trainer's module, so the colocated sync is
`inplace`; False: it needs its weights pushed, `copy`). Adding an engine: its file and one
line here.
"""

from __future__ import annotations

from typing import Any

from baton.protocol import Engine, EngineClass
from baton.registry import Registry

ENGINES = Registry("rollout engine")
ENGINES.lazy("embedded", "baton.rollout.embedded.engine:EmbeddedEngine")
ENGINES.lazy("vllm", "baton.rollout.vllm_engine:VLLMEngine")
DEFAULT_ENGINE = "embedded"  # what eval, serve, SFT and agent evaluation build (rollout.engine's default)


def context_len(engine: Engine, max_model_len: int | None = None) -> int | None:
    """The longest sequence (prompt + generated) the engine takes, if it says: its model's
    `max_position_embeddings` and a `max_model_len` (given, else the engine's own), the smaller."""
    cfg = getattr(engine.model, "config", None)
    limit = max_model_len if max_model_len is not None else engine.max_model_len
    found = [x for x in (getattr(cfg, "max_position_embeddings", None), limit) if isinstance(x, int)]
    return min(found) if found else None


def check_engine_name(name: str) -> None:
    if name not in ENGINES:
        raise ValueError(f"rollout.engine={name!r} is not one of {sorted(ENGINES)}")


def engine_class(name: str) -> EngineClass:
    """The engine class registered as `name` (imports its module)."""
    check_engine_name(name)
    try:
        return ENGINES[name]
    except ImportError as e:
        raise ImportError(f"rollout.engine={name!r} needs a package that is not installed ({e}); "
                          f"see the README's install line for the {name!r} engine") from e


def build_engine(name: str, module: Any, tokenizer: Any, *, model_path: str | None = None, **options: Any) -> Engine:
    """An engine `name` for `module` (the trainer's, or a plain copy) and `tokenizer`.

    `model_path`: the model's directory (an engine that loads its own copy starts from it).
    `options`: keyword arguments of the engine's constructor. Every engine takes
    `sleep_mode` ("cache": sleep frees the KV cache; "discard": the weights too, refilled by
    the next sync), `max_batch_tokens` (a fixed KV budget; the embedded engine also takes
    `memory_fraction`, its budget from free memory) and `fuse_weights` (the embedded engine's packed copy
    of the weights; vLLM always packs, and has no sleep mode on a CPU: see its module)."""
    return engine_class(name).build(module, tokenizer, model_path=model_path, **options)
