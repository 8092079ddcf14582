"""Sampling for Tinker's `SamplingClient`: baton's embedded engine over the served base model,
each sampler a LoRA adapter it serves by name (`EmbeddedEngine.load_lora_adapter`, the base
weights shared), or the bare base model.

`sample` is `SamplingClient.sample`: n completions of one prompt, with their tokens,
logprobs and stop reasons; `prompt_logprobs` (`compute_logprobs`, `include_prompt_logprobs`)
is one forward pass of the base weights plus the adapter's W + scale * B @ A, through
`torch.func.functional_call` (no weight is changed in place). At most `max_adapters`
adapters stay loaded; the oldest is dropped first (a sampler of a dropped snapshot is a 404;
a named checkpoint can be opened again from disk).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch.func import functional_call

from baton.algos.logprobs import logprobs_from_logits
from baton.protocol import SamplingParams
from baton.rollout.embedded.engine import PEFT_PREFIX


class Samplers:
    """The engine and the adapters loaded into it, by sampler id."""

    def __init__(self, engine: Any, max_adapters: int = 16):
        self.engine, self.max_adapters = engine, max_adapters
        self.adapters: OrderedDict[str, dict[str, tuple[torch.Tensor, torch.Tensor, float]]] = OrderedDict()

    def add(self, name: str, config: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Serve the adapter (config, PEFT tensors) as `name` (checked by the engine first)."""
        self.engine.load_lora_adapter(name, (config, tensors))
        r, alpha = int(config["r"]), float(config["lora_alpha"])
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            path, _, kind = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
            pairs.setdefault(path, {})[kind[0]] = t
        self.adapters[name] = {p: (ab["A"], ab["B"], alpha / r) for p, ab in pairs.items()}
        while len(self.adapters) > self.max_adapters:
            old, _ = self.adapters.popitem(last=False)
            self.engine.unload_lora_adapter(old)

    def has(self, name: str | None) -> bool:
        return name is None or name in self.adapters

    def sample(self, name: str | None, prompt: list[int], params: SamplingParams) -> list[tuple[str, list[int], list[float]]]:
        """(stop reason, tokens, logprobs) of each of the n completions."""
        params.lora = name
        return [(c.finish_reason, list(c.token_ids), list(c.logprobs))
                for c in self.engine.generate([prompt], params)]

    @torch.no_grad()
    def prompt_logprobs(self, name: str | None, prompt: list[int]) -> list[float]:
        """log p(prompt[t] | prompt[:t]) for t >= 1, NaN at position 0."""
        model = self.engine.model
        params = {}
        for path, (a, b, scale) in (self.adapters[name] if name is not None else {}).items():
            weight = model.get_submodule(path).weight
            params[f"{path}.weight"] = weight + scale * (b @ a).to(weight.dtype)
        ids = torch.tensor([prompt], device=self.engine.device)  # [1, T]
        logits = functional_call(model, params, args=(), kwargs={"input_ids": ids}, tie_weights=False,
                                 strict=False).logits[0]  # [T, V]
        lp = logprobs_from_logits(logits[:-1], ids[0, 1:])  # [T - 1]
        return [float("nan")] + lp.float().tolist()
