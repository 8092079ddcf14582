"""Generic runner: any HF causal LM through its own forward with its KV cache.

The cache argument is `cache` in transformers >= 5.2x (`past_key_values` is deprecated there,
to go in 5.40) and `past_key_values` before; the runner uses whichever the forward takes.

The fallback for architectures without a fast path (and for wrapped models such as PEFT
adapters). Same interface as `baton.rollout.embedded.llama.LlamaRunner`: `pack`, `start`, `decode`,
`select`, `release`. Positions come from the attention mask (`baton.padding.position_ids`),
so left padding gives every row the positions it would have unpadded.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers import DynamicCache

from baton.models.hf_cache import cache_kwarg, output_cache
from baton.padding import position_ids
from baton.rollout.embedded.llama import FAMILIES


class HFRunner:
    SHARED = frozenset()  # every attribute is the running generation's (`Generation`)

    def __init__(self, model: nn.Module):
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.takes_position_ids = "position_ids" in params
        self.extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.cache_arg = cache_kwarg(model.forward)
        self.cache = self.mask = self.next_pos = None

    def pack(self, lora=None, reuse: bool = False) -> None:  # nothing to pre-pack: HF reads its parameters itself
        if lora is not None:
            raise ValueError("serving a LoRA adapter by name needs the fast decoder path (model_type one of "
                             f"{', '.join(FAMILIES)}); {type(self.model).__name__} runs through its HF forward")

    def unpack(self) -> None:  # nothing packed
        pass

    def forget(self) -> None:  # nothing kept
        pass

    def release(self) -> None:
        self.cache = self.mask = self.next_pos = None

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        kwargs = {"input_ids": ids, "attention_mask": self.mask, self.cache_arg: self.cache, "use_cache": True,
                  **self.extra}
        if self.takes_position_ids:
            kwargs["position_ids"] = pos
        out = self.model(**kwargs)
        self.cache = output_cache(out)  # may be a new cache object
        return out.logits[:, -1]  # [b, V]

    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_new: int, n: int) -> torch.Tensor:
        self.cache = DynamicCache(config=self.model.config)
        self.mask = mask.long()  # [B, P]
        pos = position_ids(self.mask)  # [B, P]
        logits = self._forward(ids, pos)
        if n > 1:
            self.cache.batch_repeat_interleave(n)
            self.mask = self.mask.repeat_interleave(n, 0)  # [B * n, P]
        self.next_pos = self.mask.sum(-1)  # [rows]
        return logits

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask, self.next_pos = self.mask[rows], self.next_pos[rows]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        logits = self._forward(tokens[:, None], self.next_pos[:, None])
        self.next_pos = self.next_pos + 1
        return logits
