"""Rows that fit the model: every row's tokens plus the generation budget within the model's
context, checked when the data loads (a `DataError` naming the row and both lengths), never
after a step has started tokenizing or generating.

    check_lengths(located, tokenizer, context=256, budget=4, budget_key="rollout.max_new_tokens")

`located` is [(where, text)] ("FILE:LINE", the text the model reads: a rendered prompt, or a
prompt with its completion). Two bounds spare the tokenizer: a text longer than `context`
times the most characters any one token spans is refused before it is tokenized (a 50 MB
string costs a length, not 13 GB of token ids); a text whose UTF-8 bytes, doubled (room for a
normalizer that expands text), plus the special tokens fit is accepted untokenized (a token
is at least one byte in byte-level BPE, SentencePiece with byte fallback and character
vocabularies). Only the rows between the two are tokenized, in one batch, and compared exactly.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

from baton.data.records import DataError

SPECIALS_BOUND = 8  # special tokens a tokenizer adds around a text (BOS, EOS, a prefix space), at most


@lru_cache(maxsize=16)
def max_chars_per_token(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` stands for: the longest vocabulary entry
    (a byte-level BPE entry has one symbol per byte, so its length bounds its characters)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1) or 1


class LengthCheck:
    """`check_lengths` one row at a time (`add`), then `finish()`: a streamed data file is never
    held as a list of its texts; only the rows near the limit are kept, to be tokenized."""

    def __init__(self, tokenizer: Any, context: int, budget: int = 0, budget_key: str = "rollout.max_new_tokens"):
        self.room = context - budget
        if self.room < 1:
            raise DataError(f"{budget_key}={budget} leaves no room for a prompt in the model's context of "
                            f"{context} tokens")
        self.tokenizer, self.context, self.budget, self.budget_key = tokenizer, context, budget, budget_key
        self.bound = max_chars_per_token(tokenizer)
        self.close: dict[bool, list[tuple[str, str]]] = {True: [], False: []}  # add_special_tokens -> rows

    def add(self, where: str, text: str, add_special_tokens: bool = True) -> None:
        """A length first, no tokenizing: a text longer than any tokenizing of it could fit is
        refused now; one that may not fit is kept for `finish`."""
        if len(text) > self.context * self.bound:
            raise DataError(f"{where}: the row is {len(text):,} characters, at least {len(text) // self.bound:,} "
                            f"tokens: longer than the model's context of {self.context} tokens; shorten or drop it")
        extra = SPECIALS_BOUND if add_special_tokens else 0
        if 2 * len(text.encode("utf-8", "replace")) + extra > self.room:
            self.close[add_special_tokens].append((where, text))

    def finish(self) -> None:
        """Tokenize the rows kept (in one batch each) and refuse the first that does not fit."""
        for specials, close in self.close.items():
            if not close:
                continue
            ids = self.tokenizer([text for _, text in close], add_special_tokens=specials)["input_ids"]
            for (where, _), row_ids in zip(close, ids):
                if len(row_ids) > self.room:
                    raise DataError(f"{where}: the row is {len(row_ids)} tokens; with {self.budget} more "
                                    f"({self.budget_key}) that is {len(row_ids) + self.budget}, longer than the "
                                    f"model's context of {self.context} tokens; shorten or drop it")


def check_lengths(located: Iterable[tuple[str, str]], tokenizer: Any, context: int, budget: int = 0,
                  budget_key: str = "rollout.max_new_tokens", add_special_tokens: bool = True) -> None:
    """DataError for the first row whose tokens + `budget` exceed `context` (see the module
    docstring); nothing for rows that fit. `located` is read once (a generator will do)."""
    check = LengthCheck(tokenizer, context, budget, budget_key)
    for where, text in located:
        check.add(where, text, add_special_tokens)
    check.finish()
