"""A colocated LoRA policy's adapters as the embedded engine's fast path reads them: the live
tensors of the active adapter (`live_lora`), nothing merged or copied, so an optimizer step on
the adapters is seen by the next `generate`."""

from __future__ import annotations

from torch import nn

from baton.rollout.embedded import llama


def live_lora(model: nn.Module) -> llama.Lora | None:
    """{module path: (A, B, scale)} of a peft model's active adapter: the live tensors (no
    copy), so the engine samples from the adapters as trained so far. None when the
    adapters are disabled (`with model.disable_adapter()`)."""
    base = model.get_base_model()
    out: llama.Lora = {}
    for name, m in base.named_modules():
        if not hasattr(m, "lora_A") or not hasattr(m, "base_layer"):
            continue
        if getattr(m, "disable_adapters", False):
            return None
        if getattr(m, "merged", False):
            raise RuntimeError(f"{name}: the adapter is merged into the base weights; the engine reads them "
                               "unmerged (unmerge_adapter() first)")
        for a in m.active_adapters:
            if a in m.lora_A:
                if name in out:
                    raise ValueError("more than one active LoRA adapter per module is not supported")
                out[name] = (m.lora_A[a].weight, m.lora_B[a].weight, float(m.scaling[a]))
    return out
