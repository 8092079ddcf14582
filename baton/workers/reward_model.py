"""The reward-model role: scores (prompt, completion) pairs with a learned reward model.

Consumes rows with `prompt` and `completion` text; produces `reward/model` [B], the raw
score of each row. The driver adds `reward_model.weight * reward/model` to the weighted sum
of the reward functions (`reward:` section), so rule-based rewards and a model combine by
weight; with `reward.functions: {}` the model alone scores.

The model is a local HF sequence-classification directory with `num_labels=1` (what
`baton rm` writes; any HF `...ForSequenceClassification` with a `score` head loads). The
text is re-tokenised with the reward model's own tokenizer (it need not share the actor's):
`prompt + completion + EOS`, and the score is the head on the hidden state of that last
token. Scores are taken at the last real token by position, not by searching for the pad
id, so a tokenizer whose pad token is its EOS token works (HF's pooling would not).
`encode_pair` / `sequence_scores` are shared with the trainer (`baton.trainers.reward_model`),
so training and scoring see the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from baton import fields as F
from baton.batch import Batch
from baton.controller import Dispatch, Worker, register
from baton.models.precision import autocast, resolve_bf16

RM_SCORE = "reward/model"  # [B] raw reward-model score (logged as its mean, like every reward/*)


@dataclass
class RewardModelConfig:
    """The recipe's `reward_model:` section (its presence turns the role on)."""
    path: str = ""  # a local HF sequence-classification dir (num_labels=1)
    weight: float = 1.0  # rewards = sum_f w_f f + weight * score
    micro_batch_size: int = 64
    max_length: int = 512  # tokens of prompt + completion kept (the end is kept)
    bf16: bool | None = None  # bf16 autocast; None: on CUDA yes, on the CPU no (baton.models.precision)

    def check(self) -> None:
        if not self.path or not Path(self.path).is_dir():
            raise ValueError(f"reward_model.path={self.path!r} is not a local directory "
                             "(a sequence-classification checkpoint, e.g. from `baton rm`)")
        if not math.isfinite(self.weight):
            raise ValueError(f"reward_model.weight must be finite, got {self.weight}")
        if self.micro_batch_size < 1 or self.max_length < 2:
            raise ValueError("reward_model: micro_batch_size must be >= 1 and max_length >= 2")


def load_reward_model(path: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """Backbone + scalar `score` head from a local dir; a head the dir lacks (a causal LM,
    the start of `baton rm`) is initialised from `seed`."""
    from transformers import AutoModelForSequenceClassification

    if not Path(path).is_dir():
        raise FileNotFoundError(f"reward model directory not found: {path!r} (baton only loads local checkpoints)")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=dtype, local_files_only=True)


def encode_pair(tokenizer, prompt: str, completion: str, max_length: int = 512) -> list[int]:
    """Token ids the reward model reads: prompt + completion + EOS, the last `max_length`."""
    ids = tokenizer(prompt + completion, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return ids[-max_length:]


def pad_right(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # [B, T]
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return ids, mask


def sequence_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scores [B]: the `score` head on the hidden state of each row's last real token
    (right-padded input). Runs with the caller's grad mode."""
    device = next(model.parameters()).device
    ids, mask = input_ids.to(device), attention_mask.to(device)  # [B, T]
    hidden = model.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # [B, T, H]
    last = mask.sum(-1) - 1  # [B]
    h_last = hidden[torch.arange(len(ids), device=device), last]  # [B, H]
    return model.score(h_last).squeeze(-1).float()  # [B]


class RewardModelWorker(Worker):
    """`RewardModelWorker(reward_model)`: its own section only. It reads the rows' text and
    tokenizes it itself, so the host leaves its Batch on the CPU (`batch_on_device`)."""

    batch_on_device = False

    def __init__(self, reward_model: RewardModelConfig):
        super().__init__()
        from baton.models.load import load_tokenizer

        self.cfg = reward_model
        self.model = load_reward_model(reward_model.path).to(self.device).eval().requires_grad_(False)
        self.tokenizer = load_tokenizer(reward_model.path)
        self.bf16 = resolve_bf16(reward_model.bf16, self.device)

    @torch.no_grad()
    def score_texts(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        seqs = [encode_pair(self.tokenizer, p, c, self.cfg.max_length) for p, c in zip(prompts, completions)]
        out = []
        for i in range(0, len(seqs), self.cfg.micro_batch_size):
            ids, mask = pad_right(seqs[i:i + self.cfg.micro_batch_size], self.tokenizer.pad_token_id)
            with autocast(self.device, self.bf16):  # the scores come out in fp32
                out.append(sequence_scores(self.model, ids, mask).cpu())
        return torch.cat(out) if out else torch.zeros(0)

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # a future: runs beside the reference / critic
    def compute_rm_scores(self, batch: Batch) -> Batch:
        """Consumes `prompt` and `completion` text; produces `reward/model` [B] (raw scores)."""
        scores = self.score_texts([str(p) for p in batch[F.PROMPT_TEXT]],
                                  [str(c) for c in batch[F.COMPLETION_TEXT]])
        return Batch({RM_SCORE: scores})
