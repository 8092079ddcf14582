"""Checkpoints checked before they are used: a damaged or mismatched model directory is one
`ModelLoadError` line naming the file and what is wrong, never a library traceback and never a
model that loads with weights "newly initialized" or not finite.

    check_checkpoint(path)     static, before anything loads (the drivers' config checks, and
                               `load_model` for eval / serve / export): config.json is a JSON
                               object, every safetensors file is whole (its header's sizes = the
                               file's), and the tensors are exactly the ones the architecture
                               config.json names has, with its shapes (built on the meta device);
                               weights up to 2 GiB also finite (read memory-mapped)
    check_finite(model, path)  after loading: every floating-point weight finite (larger ones)
    check_tokenizer(tok, path) a tokenizer that encodes text to tokens
    model_context(path)        the longest sequence the model takes (max_position_embeddings)

A LoRA adapter dir (adapter_config.json, no config.json) is checked as an adapter: its
adapter file whole; its base is checked where it loads.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")
FINITE_BEFORE_LOAD_BYTES = 2 * 2**30  # weights up to this are checked finite before anything loads (else at load)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """A PEFT adapter dir: adapter_config.json and no model weights (a LoRA run's checkpoint
    holds its base's config.json too, for tools that read the architecture)."""
    p = Path(path)
    return (p / "adapter_config.json").is_file() and not any((p / f).is_file() for f in WEIGHT_FILES)


class ModelLoadError(FileNotFoundError):
    """A model directory that cannot be loaded; the message says why and what to do."""


def _error(message: str) -> Exception:
    return ModelLoadError(message)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or ModelLoadError naming it (empty, torn, not an object)."""
    text = path.read_bytes()
    if not text.strip():
        raise _error(f"{path}: is empty (a torn or interrupted write?)")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise _error(f"{path}: not valid JSON ({str(e).splitlines()[0]}): a torn or interrupted write?") from None
    if not isinstance(data, dict):
        raise _error(f"{path}: must hold a JSON object, got a {type(data).__name__}")
    return data


def safetensors_header(path: Path) -> dict[str, Any]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} of a safetensors file, after checking
    that the file is as long as its header says (ModelLoadError naming it otherwise)."""
    size = path.stat().st_size
    if size == 0:
        raise _error(f"{path}: is empty (0 bytes): the weights were never written or were truncated")
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise _error(f"{path}: not a safetensors file, or truncated ({size} bytes; the header needs {8 + n})")
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise _error(f"{path}: its safetensors header is not valid JSON (a damaged file)") from None
    header.pop("__metadata__", None)
    end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
    if 8 + n + end != size:
        raise _error(f"{path}: is {size:,} bytes, its header describes {8 + n + end:,}: the file is truncated "
                     f"or damaged")
    return header


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a HF model dir (sharded: the index's files)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(read_json(index).get("weight_map", {}).values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise _error(f"{index}: names {missing[0]}, which is not in {path}")
        return [path / n for n in names]
    return [path / "model.safetensors"] if (path / "model.safetensors").is_file() else []


def check_checkpoint(path: str | os.PathLike) -> None:
    """The static checks of the module docstring; nothing is loaded."""
    p = Path(path)
    if is_adapter_dir(p):
        read_json(p / "adapter_config.json")
        if (p / "adapter_model.safetensors").is_file():
            safetensors_header(p / "adapter_model.safetensors")
        return
    config = read_json(p / "config.json")
    if not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise _error(f"{p / 'config.json'}: names no model_type (an empty or partial config.json?), so no "
                     f"architecture can be built from it")
    if not any((p / f).is_file() for f in WEIGHT_FILES):
        raise _error(f"{p}: holds a config.json but no weights (one of {', '.join(WEIGHT_FILES)})")
    tensors: dict[str, Any] = {}
    files = weight_files(p)
    for file in files:
        tensors.update(safetensors_header(file))
    if tensors:
        _check_tensors(p, config, tensors)
    if files and sum(f.stat().st_size for f in files) <= FINITE_BEFORE_LOAD_BYTES:
        _check_finite_files(p, files)


def _check_finite_files(path: Path, files: list[Path]) -> None:
    """`check_finite` on the files themselves (memory-mapped, one tensor at a time), so a
    small enough checkpoint with a NaN weight is refused before a run dir is written."""
    import torch
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad = int((~torch.isfinite(t)).sum())
                    raise _error(f"{path}: weight {name!r} holds {bad} NaN/inf value(s): a diverged or damaged "
                                 f"checkpoint")


def _check_tensors(path: Path, config: dict[str, Any], tensors: dict[str, Any]) -> None:
    """The file's tensors against the architecture config.json names, built on the meta
    device (no memory, no time): none missing (tied ones excepted), none unexpected, same
    shapes."""
    import transformers

    arch = (config.get("architectures") or [None])[0]
    cls = getattr(transformers, str(arch), None) if arch else None
    if arch and cls is None or config.get("quantization_config"):
        return  # an architecture transformers does not name, quantized weights: left to its loader
    tensors, fused = _as_module_names(config, tensors)
    model = _meta_model(path, config, cls, arch)
    arch = arch or type(model).__name__
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    _check_names(path, arch, model, cls, tensors, expected)
    _check_shapes(path, arch, tensors, expected, fused)


def _meta_model(path: Path, config: dict[str, Any], cls: Any, arch: str | None) -> Any:
    """The model config.json describes, on the meta device; ModelLoadError naming config.json
    when transformers cannot read it or build the model."""
    import torch
    import transformers

    try:
        hf_config = transformers.AutoConfig.for_model(**config)
    except Exception as e:  # noqa: BLE001 - any library error is one line here
        raise _error(f"{path / 'config.json'}: not a config transformers reads ({str(e).splitlines()[0]})") from None
    try:
        with torch.device("meta"):  # no `architectures`: the causal LM of its model_type, as load_model builds
            return cls(hf_config) if cls else transformers.AutoModelForCausalLM.from_config(hf_config)
    except Exception as e:  # noqa: BLE001
        raise _error(f"{path / 'config.json'}: cannot build {arch or 'a causal LM'} from it "
                     f"({str(e).splitlines()[0]})") from None


def _check_names(path: Path, arch: str, model: Any, cls: Any, tensors: dict[str, Any],
                 expected: dict[str, tuple]) -> None:
    """None of the model's tensors missing from the file (one of a tied group is enough), none
    in the file that the model lacks (recomputed buffers and the class's ignored keys aside)."""
    groups: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), []).append(name)
    missing = [names[0] for names in groups.values() if not any(n in tensors for n in names)]
    # buffers the model recomputes, which older files hold (per layer: `...rotary_emb.inv_freq`)
    buffers = {name.rsplit(".", 1)[-1] for name, _ in model.named_buffers()}
    ignored = [re.compile(p) for p in getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or []]
    unexpected = sorted(n for n in set(tensors) - set(expected)
                        if n.rsplit(".", 1)[-1] not in buffers and not any(p.search(n) for p in ignored))
    if missing:
        raise _error(f"{path}: the weights lack {len(missing)} tensor(s) that {arch} (config.json) has, e.g. "
                     f"{missing[0]!r}: weights of another architecture? (they would load as newly initialized)")
    if unexpected:
        raise _error(f"{path}: the weights hold {len(unexpected)} tensor(s) that {arch} (config.json) does not "
                     f"have, e.g. {unexpected[0]!r}: weights of another architecture?")


def _check_shapes(path: Path, arch: str, tensors: dict[str, Any], expected: dict[str, tuple],
                  fused: dict[str, tuple]) -> None:
    """Every fused tensor whole (all its per-expert pieces), every other tensor the model's shape."""
    for name, (count, want) in fused.items():
        if count != want:
            raise _error(f"{path}: the weights hold {count} of the {want} per-expert tensors that make {name!r}: "
                         f"a damaged checkpoint, or one of another expert count?")
    for name, meta in tensors.items():
        if name in expected and name not in fused and tuple(meta["shape"]) != expected[name]:
            raise _error(f"{path}: tensor {name!r} has shape {list(meta['shape'])}, {arch} as config.json "
                         f"describes it needs {list(expected[name])}: weights of another size?")


def _as_module_names(config: dict[str, Any], tensors: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple]]:
    """The file's tensors under the names the module has, for a family whose files hold
    another layout (transformers renames and fuses them on load: a mixture of experts'
    per-expert `experts.3.gate_proj.weight` / `.up_proj.weight` become one stacked
    `experts.gate_up_proj`), and {fused name: (tensors found, tensors it needs)}; as they are
    for every other family."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    rules = get_checkpoint_conversion_mapping(config.get("model_type")) or []
    experts = config.get("num_experts") or config.get("num_local_experts") or 0
    out: dict[str, Any] = {}
    fused: dict[str, tuple[int, int]] = {}
    for name, meta in tensors.items():
        for rule in rules:
            for source in rule.source_patterns:
                match = re.search(re.escape(source).replace(r"\*", r"\d+"), name)
                if match is None:
                    continue
                name = name[:match.start()] + rule.target_patterns[0] + name[match.end():]
                if "*" in source:  # one expert's piece of a stacked tensor
                    count = fused.get(name, (0, 0))[0] + 1
                    fused[name] = (count, experts * len(rule.source_patterns))
                break
        out[name] = meta
    return out, fused


def check_finite(model: Any, path: str | os.PathLike) -> None:
    """ModelLoadError naming the first weight that holds NaN or inf values."""
    import torch

    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise _error(f"{path}: weight {name!r} holds {bad} NaN/inf value(s): a diverged or damaged checkpoint")


def check_tokenizer(tokenizer: Any, path: str | os.PathLike) -> None:
    """ModelLoadError unless the tokenizer turns text into tokens (a dir without its
    tokenizer.json may load as a tokenizer that encodes everything to nothing)."""
    if not tokenizer("hello world 123", add_special_tokens=False)["input_ids"]:
        files = ", ".join(sorted(f.name for f in Path(path).iterdir() if "token" in f.name)) or "none"
        raise _error(f"{path}: its tokenizer encodes text to no tokens (tokenizer files: {files}; is "
                     f"tokenizer.json missing?)")


def model_context(path: str | os.PathLike) -> int | None:
    """The longest sequence the model in `path` takes, from its config.json; None if it does
    not say (or has none: an adapter dir, whose base says)."""
    p = Path(path)
    if not (p / "config.json").is_file():
        return None
    config = read_json(p / "config.json")
    found = [config[k] for k in CONTEXT_KEYS if isinstance(config.get(k), int)]
    return min(found) if found else None
