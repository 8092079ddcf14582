"""`PairFileSource`: offline DPO's rows, preference pairs from a jsonl file (registered as
"pairs" in `baton.sources.SOURCES`, read by the `dpo` driver, baton/trainers/offline_dpo.py).

    pairs = load_pairs("pairs.jsonl")            # baton.data.records: [{"prompt", "chosen", "rejected"}, ...]
    rows = encode_pairs(tokenizer, collate(pairs), multiple=world_size)   # pair-major rows

Data: one JSON object per line, {"prompt": str, "chosen": str, "rejected": str}. The prompt
is tokenized as the rollout engine tokenizes prompts, each completion as plain text followed
by EOS (a sampled completion that stops ends with EOS too), so a model trained offline and
online sees the same sequences.
"""

from __future__ import annotations

from typing import Any

import torch

from baton import fields as F
from baton.batch import Batch
from baton.models.load import load_tokenizer
from baton.padding import pad_left, pad_right
from baton.sources.base import Prompts
from baton.workers.dpo_actor import pair_rows

def encode_pairs(tokenizer: Any, pairs: Batch, multiple: int = 1) -> Batch:
    """Pair-major model rows (chosen, rejected, chosen, ...) of text pairs, padded to a
    multiple of `multiple` pairs (see `baton.workers.dpo_actor.pair_rows`)."""
    prompts = [tokenizer(str(p)).input_ids for p in pairs["prompt"]]  # as RolloutWorker.generate
    eos = tokenizer.eos_token_id
    completions = [tokenizer(str(text), add_special_tokens=False).input_ids + [eos]
                   for c, r in zip(pairs["chosen"], pairs["rejected"]) for text in (c, r)]
    p_ids, p_mask = pad_left([p for p in prompts for _ in range(2)], tokenizer.pad_token_id)  # [2P, Pl]
    r_ids, r_mask = pad_right(completions, tokenizer.pad_token_id, torch.long)  # [2P, R]
    rows = Batch({F.PROMPT_IDS: p_ids, F.PROMPT_MASK: p_mask, F.RESPONSE_IDS: r_ids, F.RESPONSE_MASK: r_mask})
    n = len(prompts)
    return pair_rows(rows, torch.arange(0, 2 * n, 2), torch.arange(1, 2 * n, 2), multiple)


class PairFileSource:
    """The row source of offline DPO: the next `data.pairs_per_step` pairs of the file (the
    run's seeded, resumable sampler), encoded pair-major. A colocated rollout engine (held-out
    generation accuracy) is told each new version."""

    def __init__(self, cfg: Any, tokenizer: Any, state: Prompts, rollout: Any) -> None:
        self.cfg, self.tokenizer, self.state, self.rollout = cfg, tokenizer, state, rollout

    def rows(self, step: int) -> Batch:
        return encode_pairs(self.tokenizer, self.state.next_prompts(self.cfg.data.pairs_per_step),
                            multiple=self.cfg.placement.world_size)

    def weights_updated(self, version: int, check: bool = False) -> list[float] | None:
        if self.rollout is not None:  # colocated: tags the engine with the new version
            return self.rollout.sync_weights(version, check=check)
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}  # the sampler's position is saved by RunState

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def checkpointed(self, step: int) -> None:
        pass  # nothing to acknowledge: the pairs' position is in the checkpoint

    def close(self) -> None:
        pass


def build(cfg: Any, roles: dict[str, Any], state: Prompts) -> PairFileSource:
    """The pairs of `cfg.data` (an `OfflineDPOConfig`), told the colocated rollout (if any)."""
    return PairFileSource(cfg, load_tokenizer(cfg.model.path), state, roles.get("rollout"))
