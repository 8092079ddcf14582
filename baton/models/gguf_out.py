"""`baton export CKPT OUT.gguf --gguf`: a checkpoint as one GGUF file that llama.cpp, ollama,
LM Studio and transformers' GGUF loader read, written with the `gguf` package's writer and its
tensor-name tables (nothing of the format by hand), the way llama.cpp's convert_hf_to_gguf.py
writes the same model:

- hyperparameters under the architecture's keys (block count, context, widths, heads, rope
  base, norm epsilon; llama also its rope dimension and vocabulary size);
- the tokenizer as `tokenizer.ggml.model=gpt2` (byte-level BPE): tokens (in id order, `[PADn]`
  where the model has more rows than the tokenizer ids), their types (control for special added
  tokens, user-defined for other added ones), merges, bos/eos/pad ids and the chat template
  (`gguf.SpecialVocab`), the pre-tokenizer named after its split regex;
- tensors renamed with `gguf.TensorNameMap`; llama's Q and K projections permuted as llama.cpp
  stores them (`GgufArch.permute_qk`); a tied output head not written (readers tie it back).

`--gguf-type`: f32 (exact), f16 (matrices in f16, vectors in f32) or q8_0 (matrices whose rows
are a multiple of 32 quantized, by `gguf.quants`). The file is written beside OUT and renamed
into place; every check (architecture, tokenizer, rope scaling) comes before it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from baton.models.gguf_file import ARCHITECTURES, import_gguf, unsupported

GGUF_TYPES = ("f32", "f16", "q8_0")


@dataclass
class Hparams:
    """What the writer needs from a config.json (transformers' config object)."""

    arch: str
    blocks: int
    heads: int
    kv_heads: int
    head_dim: int
    config: Any


def read_hparams(config: Any, where: str) -> Hparams:
    from baton.config import ConfigError

    arch = getattr(config, "model_type", "")
    if arch not in ARCHITECTURES:
        raise ConfigError(unsupported(arch, f"baton export --gguf {where}"))
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"baton export --gguf {where}: rope scaling {rope.get('rope_type')!r} is not written "
                          f"to GGUF by baton (default rope only)")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return Hparams(arch, config.num_hidden_layers, heads, config.num_key_value_heads or heads, head_dim, config)


def rope_theta(config: Any) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def write_hparams(writer: Any, hp: Hparams, name: str, file_type: int) -> None:
    c = hp.config
    writer.add_name(name)
    writer.add_block_count(hp.blocks)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(hp.heads)
    writer.add_head_count_kv(hp.kv_heads)
    writer.add_rope_freq_base(rope_theta(c))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_file_type(file_type)
    if hp.arch == "llama":
        writer.add_vocab_size(c.vocab_size)
        writer.add_rope_dimension_count(hp.head_dim)


def pre_tokenizer_name(tokenizer: Any) -> str:
    """llama.cpp's name of the tokenizer's split regex (transformers' table of them), else gpt-2's."""
    import json

    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    pre = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    found = json.dumps(pre)
    for name, regex in GGUF_PRE_TOKENIZER_SPLITS.items():
        if json.dumps(regex)[1:-1] in found:
            return name
    return "gpt-2"


def vocab(tokenizer: Any, n_rows: int, where: str) -> tuple[list[str], list[int]]:
    """Tokens in id order and their GGUF token types (llama.cpp's `get_vocab_base`)."""
    from baton.config import ConfigError

    gguf = import_gguf()
    if not tokenizer.is_fast or json_model_type(tokenizer) != "BPE":
        raise ConfigError(f"baton export --gguf {where}: the tokenizer is not a byte-level BPE one (gpt2 in GGUF), "
                          f"the only kind baton writes")
    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(n_rows):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def json_model_type(tokenizer: Any) -> str:
    import json

    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]["type"]


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: each head's rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(gguf: Any, data: np.ndarray, kind: str) -> tuple[np.ndarray, Any]:
    """(the array to write, its raw GGML type or None) for `--gguf-type kind`."""
    q = gguf.GGMLQuantizationType
    if data.ndim < 2 or kind == "f32":
        return data.astype(np.float32), None
    if kind == "q8_0" and data.shape[-1] % gguf.GGML_QUANT_SIZES[q.Q8_0][0] == 0:
        return gguf.quants.quantize(data.astype(np.float32), q.Q8_0), q.Q8_0
    return data.astype(np.float16), None


def add_tensors(writer: Any, gguf: Any, state: dict[str, Any], hp: Hparams, kind: str, where: str) -> None:
    from baton.config import ConfigError

    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[hp.arch]
    names = gguf.get_tensor_name_map(arch_enum, hp.blocks)
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_enum]}
    tied = bool(getattr(hp.config, "tie_word_embeddings", False))
    for hf_name, tensor in state.items():
        if tied and hf_name == "lm_head.weight":
            continue  # readers tie the output head to token_embd when output.weight is absent
        found = names.get_type_and_name(hf_name, try_suffixes=(".weight", ".bias"))
        if found is None or gguf.TENSOR_NAMES[found[0]] not in allowed:
            raise ConfigError(f"baton export --gguf {where}: tensor {hf_name!r} has no name in gguf's "
                              f"{hp.arch} table")
        data = tensor.detach().float().cpu().numpy()
        if ARCHITECTURES[hp.arch].permute_qk and found[0] == gguf.MODEL_TENSOR.ATTN_Q:
            data = permute(data, hp.heads)
        elif ARCHITECTURES[hp.arch].permute_qk and found[0] == gguf.MODEL_TENSOR.ATTN_K:
            data = permute(data, hp.kv_heads)
        data, raw = encode(gguf, data, kind)
        writer.add_tensor(found[1], data, raw_dtype=raw)


FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0"}


def export_gguf(checkpoint: str | os.PathLike, out: str | os.PathLike, kind: str = "f16") -> Path:
    """Write checkpoint dir `checkpoint` (a LoRA adapter dir loads merged onto its base) as GGUF
    file `out`; ConfigError (one line) for what cannot be written, before the file is."""
    import torch
    from transformers.utils import logging as hf_logging

    from baton.config import ConfigError
    from baton.models.load import adapter_base, load_model, load_tokenizer

    gguf = import_gguf()
    hf_logging.disable_progress_bar()  # "Loading weights": noise beside the line the command prints
    if kind not in GGUF_TYPES:
        raise ConfigError(f"--gguf-type {kind!r}: choose one of {', '.join(GGUF_TYPES)}")
    where = str(checkpoint)
    model_dir = adapter_base(checkpoint) or Path(checkpoint)
    from transformers import AutoConfig

    hp = read_hparams(AutoConfig.from_pretrained(str(model_dir), local_files_only=True), where)
    tokenizer = load_tokenizer(checkpoint)
    tokens, types = vocab(tokenizer, hp.config.vocab_size, where)
    logging.getLogger("gguf.vocab").setLevel(logging.ERROR)  # "no merges found": written as an empty list below
    special = gguf.SpecialVocab(str(tokenizer.name_or_path), load_merges=True, n_vocab=len(tokens))
    model = load_model(checkpoint, dtype=torch.float32)  # an adapter merged onto its base (--merge's path)
    target = Path(out).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), hp.arch)
    try:
        write_hparams(writer, hp, target.stem, getattr(gguf.LlamaFileType, FILE_TYPES[kind]))
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre_tokenizer_name(tokenizer))
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        special.add_to_gguf(writer, quiet=True)
        if not special.merges:  # a byte-level vocabulary with no merges (baton's tiny models): the writer
            writer.add_token_scores([0.0] * len(tokens))  # skips an empty list, and readers derive merges from scores
        if tokenizer.chat_template and special.chat_template is None:
            writer.add_chat_template(tokenizer.chat_template)
        add_tensors(writer, gguf, model.state_dict(), hp, kind, where)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target
