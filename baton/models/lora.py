"""LoRA on the policy (peft): the recipe's `model.lora`, adapters in PEFT format, merging.

    model:
      path: checkpoints/arith-sft
      lora: {rank: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj, v_proj, ...]}

`apply_lora` wraps a loaded causal LM with `peft.get_peft_model`: every base parameter is
frozen, only the adapters (lora_A / lora_B of each targeted linear) train. lora_A's random
init is seeded, so every data-parallel rank builds the same adapters. The base model stays
inside: `with model.disable_adapter():` *is* the reference policy (no second model).

On disk an adapter is PEFT's format (`adapter_config.json` + `adapter_model.safetensors`,
keys `base_model.model.<module>.lora_A.weight`), which vLLM and SGLang load too;
`merge_adapter_dir` writes base + adapter as one plain HF checkpoint (`baton export --merge`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass
class LoraAdapterConfig:
    """The recipe's `model.lora:` section (its presence turns LoRA on)."""
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(ALL_LINEAR))

    def check(self) -> None:
        if self.rank < 1 or self.alpha <= 0 or not 0 <= self.dropout < 1 or not self.target_modules:
            raise ValueError(f"model.lora: rank >= 1, alpha > 0, dropout in [0, 1) and some target_modules "
                             f"are needed (got {asdict(self)})")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def apply_lora(model: nn.Module, cfg: LoraAdapterConfig, seed: int = 0) -> nn.Module:
    """`model` with LoRA adapters (a `peft.PeftModel`); base weights frozen. Seeded init."""
    from peft import LoraConfig, get_peft_model

    cfg.check()
    config = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                        target_modules=_targets(model, list(cfg.target_modules)), bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    return peft_model


def _targets(model: nn.Module, targets: list[str]) -> list[str]:
    """The modules to adapt. A mixture of experts gets adapters on attention only: its experts
    are stacked [E, ...] parameters, not linears (the default list keeps its attention names;
    a list naming the MLP's projections is refused)."""
    from baton.models.moe import is_moe

    if not is_moe(model):
        return targets
    mlp = [t for t in targets if t in _MLP]
    if targets == ALL_LINEAR:
        return [t for t in targets if t not in _MLP]
    if mlp:
        raise ValueError(f"model.lora.target_modules: {', '.join(mlp)} are a mixture of experts' expert weights here; "
                         f"LoRA on a mixture of experts adapts attention only (q_proj, k_proj, v_proj, o_proj)")
    return targets


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def adapter_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT key, tensor) of the active adapter, the names `adapter_model.safetensors` uses
    (`base_model.model.<module>.lora_A.weight`); the live tensors, no copy."""
    for name, p in model.named_parameters():
        if "lora_" in name and p.requires_grad:
            yield name.replace(".default.", "."), p.detach()


@torch.no_grad()
def merged_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(base model name, W + scale * B @ A) of every weight of a peft model: the plain
    model's state a generator apart from the actor loads (`WeightsWorker`), with the names
    the base model has (`model.layers.0.self_attn.q_proj.weight`; no lora_A / lora_B). New
    tensors where an adapter applies; the live base tensors elsewhere."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    lora_layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    for name, p in base.named_parameters():
        if "lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".")
        layer_name = owner.removesuffix(".base_layer")
        layer = lora_layers.get(layer_name) if owner.endswith(".base_layer") else None
        plain = f"{layer_name}.{leaf}"
        if layer is not None and leaf == "weight" and not layer.merged:
            delta = sum(layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.lora_A)
            yield plain, p.detach() + delta.to(p.dtype)
        else:
            yield plain, p.detach()


def adapter_config(model: nn.Module, base_path: str | os.PathLike | None = None) -> dict:
    """The active adapter's PEFT config as `adapter_config.json` holds it."""
    cfg = model.peft_config["default"].to_dict()
    for k, v in list(cfg.items()):
        if isinstance(v, set):
            cfg[k] = sorted(v)
    if base_path is not None:
        cfg["base_model_name_or_path"] = str(base_path)
    return cfg


def save_adapter(named: Iterator[tuple[str, torch.Tensor]] | dict, config: dict, directory: str | os.PathLike) -> int:
    """Write a PEFT adapter dir (config + safetensors) into an existing `directory` (the
    caller makes it atomic); returns the bytes of tensor data written."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in (named.items() if isinstance(named, dict) else named)}
    d = Path(directory)
    save_file(tensors, str(d / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (d / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def read_adapter(directory: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, {PEFT key: tensor}) of a PEFT adapter dir."""
    from safetensors.torch import load_file

    d = Path(directory)
    if not (d / ADAPTER_CONFIG).is_file() or not (d / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"{str(d)!r} is not a PEFT adapter dir ({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS})")
    return json.loads((d / ADAPTER_CONFIG).read_text()), load_file(str(d / ADAPTER_WEIGHTS))


@torch.no_grad()
def load_adapter_into(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy saved adapter tensors into the live adapters of `model` (in place)."""
    live = dict(adapter_tensors(model))
    missing = sorted(set(live) - set(tensors))
    if missing:
        raise KeyError(f"adapter misses {len(missing)} tensors, e.g. {missing[0]!r}")
    for k, p in live.items():
        p.copy_(tensors[k])


def merge_adapter_dir(adapter_dir: str | os.PathLike, out_dir: str | os.PathLike,
                      base_path: str | os.PathLike | None = None) -> Path:
    """base + adapter merged into one plain HF checkpoint at `out_dir` (with the tokenizer
    of the adapter dir, else of the base). `base_path` defaults to the adapter config's
    `base_model_name_or_path`."""
    from peft import PeftModel

    from baton.models.load import load_model, load_tokenizer, save_pretrained, untie_lm_head

    config, _ = read_adapter(adapter_dir)
    base_path = base_path or config.get("base_model_name_or_path")
    if not base_path:
        raise ValueError(f"{adapter_dir}: no base model path in {ADAPTER_CONFIG}; pass one")
    base = load_model(base_path)
    untie_lm_head(base, config)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    tok_dir = adapter_dir if (Path(adapter_dir) / "tokenizer_config.json").exists() else base_path
    return save_pretrained(merged, load_tokenizer(tok_dir), out_dir)
