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

`check_grammar` compiles a grammar once without the model's tokenizer (on a byte-level one)
and takes its first step: a grammar that does not compile, or whose language is empty (a
regex like `[^\\s\\S]`, a JSON schema that only refers to itself), is a ValueError naming it.
Results are cached by the grammar's hash (a server checks each request's grammar; a 3 MB
schema costs ~0.8 s of CPU to compile). A grammar whose language empties later (a prefix
leads nowhere) ends its row with EOS and finish reason `GRAMMAR_ERROR`, never "stop".
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

import torch

from baton.protocol import GRAMMAR_ERROR

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


_CHECKED: OrderedDict[bytes, str | None] = OrderedDict()  # sha256 of a grammar -> its error (None: fine)
_CHECKED_MAX = 256
_CHECK_LOCK = threading.Lock()
EMPTY = ("matches no text at all (its language is empty: e.g. a regex like [^\\s\\S], "
         "a JSON schema that only refers to itself)")


def check_grammar(grammar: str) -> None:
    """ValueError with llguidance's reason when `grammar` does not compile, or naming it when
    no text matches it (no model tokenizer needed); cached by the grammar's hash."""
    llg = _llguidance()  # first, whatever is cached: a missing extra is always said
    key = hashlib.sha256(grammar.encode("utf-8", "surrogatepass")).digest()
    with _CHECK_LOCK:
        known = key in _CHECKED
        error = _CHECKED.get(key)
        if known:
            _CHECKED.move_to_end(key)
    if not known:
        error = _grammar_error(llg, grammar)
        with _CHECK_LOCK:
            _CHECKED[key] = error
            while len(_CHECKED) > _CHECKED_MAX:
                _CHECKED.popitem(last=False)
    if error is not None:
        raise ValueError(error)


def _grammar_error(llg: Any, grammar: str) -> str | None:
    """Why `grammar` cannot be used (None: it can): compiled on llguidance's byte tokenizer,
    its first mask computed (an empty language fails there: nothing may come first)."""
    byte = llg.LLTokenizer("byte")
    matcher = llg.LLMatcher(byte, grammar, log_level=0)
    if matcher.is_error():  # a compile error, or a construct the byte tokenizer lacks (a named special token)
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
        return f"grammar: {messages[0] if messages else 'invalid'}" if is_error else None
    words = (byte.vocab_size + 31) // 32
    bits = torch.zeros(words, dtype=torch.int32)
    matcher.unsafe_compute_mask_ptr(bits.data_ptr(), words * 4)
    return f"grammar: {EMPTY}" if matcher.is_error() else None


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
        self.failed = [False] * rows  # the matcher allowed nothing (or refused a token): GRAMMAR_ERROR
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
            # a matcher in error (nothing may follow: llguidance then allows EOS alone) or
            # allowing nothing: the row fails, ended with EOS
            self.failed[r] = m.is_error()
            if self.failed[r] or not bool(bits[j].any()):
                self.failed[r] = True
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
                self.failed[r] = self.failed[r] or not ok or m.is_error()
                done[j] = True
        return done

    def finish_reason(self, row: int, stopped: bool) -> str:
        """The row's finish reason: GRAMMAR_ERROR if its matcher failed, else stop / length."""
        return GRAMMAR_ERROR if self.failed[row] else "stop" if stopped else "length"
