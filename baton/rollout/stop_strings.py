"""Stop strings during decoding: which rows' text now contains one (`StopStringMatcher`),
decoding only each row's tail so a step's cost does not grow with the completion."""

from __future__ import annotations

from typing import Any

import torch


class StopStringMatcher:
    """Tracks each row's generated tokens and reports rows whose text now contains a stop
    string. Only the tail is decoded (enough tokens to hold the longest stop string), so a
    step costs O(rows * tail) whatever the length so far."""

    def __init__(self, tokenizer: Any, stops: list[str], rows: int):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        # a token is >= 1 character, or >= 1 byte (<= 4 per character) for byte-level
        # vocabularies, so this many tokens always hold the longest stop string
        self.tail = 4 * max((len(s) for s in self.stops), default=0) + 4
        self.tokens: list[list[int]] = [[] for _ in range(rows)]

    def push(self, rows: list[int], new_tokens: list[int]) -> torch.Tensor:
        hits = torch.zeros(len(rows), dtype=torch.bool)
        for j, (r, tok) in enumerate(zip(rows, new_tokens)):
            seq = self.tokens[r]
            seq.append(tok)
            text = self.tokenizer.decode(seq[-self.tail:])
            hits[j] = any(s in text for s in self.stops)
        return hits
