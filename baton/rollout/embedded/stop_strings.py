"""Stop strings during decoding: where a row's text first contains one (`StopStringMatcher`),
decoding only each row's tail so a token's cost does not grow with the completion.

The engine hands it the tokens of the last k steps at once (one host read every k steps, not
one a token): `push_block` pushes each row's tokens one at a time, exactly as k single pushes
would, and says at which of them the row's text first held a stop string."""

from __future__ import annotations

from typing import Any


class StopStringMatcher:
    """Tracks each row's generated tokens and reports where a row's text first contains a stop
    string. Only the tail is decoded (enough tokens to hold the longest stop string), so a
    token costs O(tail) whatever the length so far."""

    def __init__(self, tokenizer: Any, stops: list[str], rows: int):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        # a token is >= 1 character, or >= 1 byte (<= 4 per character) for byte-level
        # vocabularies, so this many tokens always hold the longest stop string
        self.tail = 4 * max((len(s) for s in self.stops), default=0) + 4
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.stopped: set[int] = set()  # rows whose text already held a stop string

    def push_block(self, rows: list[int], blocks: list[list[int]]) -> list[int | None]:
        """blocks[j]: row rows[j]'s next tokens, in order. Returns, per row, the index in its
        block of the token after which its text first holds a stop string (None: not in this
        block, or it already did earlier: its later tokens are cut anyway)."""
        first: list[int | None] = []
        for r, block in zip(rows, blocks):
            seq, at = self.tokens[r], None
            for i, tok in enumerate(block):
                seq.append(tok)
                if r in self.stopped:
                    continue
                text = self.tokenizer.decode(seq[-self.tail:])
                if any(s in text for s in self.stops):
                    self.stopped.add(r)
                    at = i
            first.append(at)
        return first
