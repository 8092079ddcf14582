"""Constrained decoding for the embedded engine: `SamplingParams.grammar` (a Lark grammar,
llguidance's dialect: `baton.rollout.grammars`) enforced token by token with llguidance,
the grammar library vLLM and SGLang use (`pip install 'baton-rl[structured]'`; imported
only when a request has a grammar).

Each step, before sampling, every running row's matcher computes the tokens its grammar
allows next (a bitmask) and the others' logits become -inf, so they cannot be drawn (the
sampler never draws a zero-probability token). The sampled tokens are then fed to the
matchers. A row whose grammar is complete stops at the EOS the grammar then requires (a
stop even with `ignore_eos`).

Logprobs: the engine records log_softmax(masked logits / T), the logprob of the token under
the distribution it was actually sampled from (vLLM's "processed" logprobs; its default
returns the raw model's): a token the grammar forced has logprob 0. So a constrained
rollout's `rollout_logprobs` are the behaviour policy mu = the model restricted to the
grammar, renormalised. The trainer's forward has no grammar: its logprob of the same token
is lower by log Z (Z: the mass the grammar allowed). For PPO that gap is a real policy
difference, not noise: recompute the old logprobs (`algo.recompute_old_logprobs: true`, or
`algo.off_policy: tis`), so the clipped ratio is trainer-to-trainer and the behaviour
logprobs only weigh tokens (pi/mu = Z <= 1: tokens the grammar squeezed count less).
"""

from __future__ import annotations

from typing import Any

import torch

INSTALL = "pip install 'baton-rl[structured]'  (llguidance)"
_TOKENIZERS: dict[tuple[int, int, tuple[int, ...]], Any] = {}  # (id(tokenizer), vocab, eos) -> LLTokenizer


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError:
        raise ImportError(f"structured outputs (response_format, a forced tool_choice, a grammar) need "
                          f"llguidance: {INSTALL}") from None
    return llguidance


def check_grammar(grammar: str) -> None:
    """ValueError with llguidance's reason when `grammar` does not compile (no tokenizer needed)."""
    llg = _llguidance()
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"grammar: {messages[0] if messages else 'invalid'}")


def _tokenizer(tokenizer: Any, vocab: int, eos_ids: list[int]) -> Any:
    """llguidance's view of `tokenizer` (built once: ~1 s for a 150k vocabulary)."""
    key = (id(tokenizer), vocab, tuple(eos_ids))
    if key not in _TOKENIZERS:
        llg = _llguidance()
        try:
            _TOKENIZERS[key] = llg.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=list(eos_ids) or None)
        except ValueError as exc:  # a slow (Python) tokenizer
            raise ValueError(f"structured outputs need a fast tokenizer: {exc}") from exc
    return _TOKENIZERS[key]


class Guide:
    """Per-row grammar state for one generation group (`rows` sample rows)."""

    def __init__(self, grammar: str, tokenizer: Any, vocab: int, eos_ids: list[int], rows: int):
        if tokenizer is None:
            raise ValueError("structured outputs need a tokenizer")
        llg = _llguidance()
        first = llg.LLMatcher(_tokenizer(tokenizer, vocab, eos_ids), grammar, log_level=0)
        if first.is_error():
            raise ValueError(f"grammar: {first.get_error()}")
        self.matchers = [first] + [first.deep_copy() for _ in range(rows - 1)]
        self.ended = [False] * rows  # grammar complete (or failed): no more masking for the row
        self.vocab, self.eos_ids = vocab, eos_ids
        self.words = (vocab + 31) // 32
        self.bits = torch.full((rows, self.words), -1, dtype=torch.int32)  # CPU: llguidance writes it
        self.shifts = torch.arange(32, dtype=torch.int32)

    def mask(self, logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """logits [b, V] of batch rows `rows` (group rows), with -inf where the grammar forbids."""
        bits = self.bits[:len(rows)]
        for j, r in enumerate(rows):
            m = self.matchers[r]
            if self.ended[r]:
                bits[j] = -1  # finished rows are cut at their stop: anything goes
                continue
            m.unsafe_compute_mask_ptr(bits[j].data_ptr(), self.words * 4)
            if not bool(bits[j].any()):  # nothing allowed (the matcher failed): end the row with EOS
                bits[j] = 0
                for e in self.eos_ids:
                    bit = 1 << (e % 32)
                    bits[j, e // 32] |= bit - (1 << 32) if bit >= 1 << 31 else bit  # int32: bit 31 is the sign
        allowed = ((bits.unsqueeze(-1) >> self.shifts) & 1).view(len(rows), -1)[:, :logits.shape[-1]]  # [b, V]
        return logits.masked_fill(allowed.to(logits.device) == 0, float("-inf"))

    def advance(self, rows: list[int], tokens: list[int]) -> torch.Tensor:
        """Feed each row its sampled token; True for rows whose grammar is now complete."""
        done = torch.zeros(len(rows), dtype=torch.bool)
        for j, (r, tok) in enumerate(zip(rows, tokens)):
            if self.ended[r]:
                continue
            m = self.matchers[r]
            ok = m.consume_token(tok)
            # complete: once the EOS the grammar ends with is sampled (it alone is allowed
            # after the grammar's last token), so the row's tokens end as a model's turn does
            if not ok or m.is_error() or m.is_stopped() and (tok in self.eos_ids or not self.eos_ids):
                self.ended[r] = True
                done[j] = True
        return done
