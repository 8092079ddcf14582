"""Token-in/token-out trajectories: the engine's sampled ids are kept as sampled; the
tokens between turns come from the chat template.

A trajectory is prompt ids + a response of segments:
    policy    the engine's ids and behaviour logprobs for one turn         mask 1
    boundary  what the template writes after an assistant message's content
              (Qwen2.5 "<|im_end|>\\n", Llama-3 "<|eot_id|>"), less the end-of-turn token
              when the model sampled it (ChatML: "\\n"); all of it after a turn ended by
              max_tokens or the context limit (baton.data.turns; the gateway's turns too)
    obs       the template's delta for the new messages: render(conversation + new,
              generation prompt) minus render(conversation), text suffix tokenized   mask 0
Nothing already in the trajectory is ever re-tokenized.

`check(trajectory)` re-renders the whole conversation and compares its tokens with the
trajectory's: `[]` when equal, else one `Mismatch(segment kind, turn, position)` per
segment that differs (a metric in training; tests assert it is empty).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from baton.data.turns import assistant_close, boundary_after

POLICY, BOUNDARY, OBS = "policy", "boundary", "obs"


def render(tokenizer: Any, messages: list[dict], tools: list[dict] | None, gen: bool,
           template: str | None = None) -> str:
    kw = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                         chat_template=template, **kw)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


@dataclass
class Segment:
    kind: str
    turn: int
    ids: list[int]
    logprobs: list[float] | None = None
    version: int = -1  # policy segments: the weight version that sampled them


@dataclass
class Mismatch:
    kind: str
    turn: int
    position: int  # first differing index within the response


@dataclass
class Conversation:
    """One conversation as tokens. `messages` mirrors the segments (for re-rendering)."""
    tokenizer: Any
    messages: list[dict]
    tools: list[dict] | None = None
    template: str | None = None
    prompt_ids: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)  # one per policy turn
    statuses: list[str] = field(default_factory=list)  # parse status per policy turn
    truncated: bool = False  # cut at the token budget: trailing template tokens may be missing
    close: str = ""  # what the template writes after an assistant message's content

    def __post_init__(self) -> None:
        self.prompt_ids = encode(self.tokenizer, render(self.tokenizer, self.messages, self.tools, True, self.template))
        self.close = assistant_close(self.tokenizer, self.template)

    @property
    def turns(self) -> int:
        return sum(s.kind == POLICY for s in self.segments)

    @property
    def response_len(self) -> int:
        return sum(len(s.ids) for s in self.segments)

    def add_turn(self, ids: list[int], logprobs: list[float], content: str, version: int = 0) -> None:
        """The engine's ids for one assistant turn, sampled by weights `version`, and its
        message content (the text of the ids without the end-of-turn token). Adds the
        template's boundary after it (when the sampled text does not render back, e.g. the
        template trims it, check() says so)."""
        turn = self.turns
        self.segments.append(Segment(POLICY, turn, list(ids), list(logprobs), version))
        self.messages.append({"role": "assistant", "content": content})
        self.segments.append(Segment(BOUNDARY, turn, encode(self.tokenizer, boundary_after(self.tokenizer, ids,
                                                                                            self.close))))

    def add_observation(self, messages: list[dict]) -> None:
        """New non-assistant messages and the generation prompt after them, mask 0."""
        before = render(self.tokenizer, self.messages, self.tools, False, self.template)
        self.messages.extend(messages)
        after = render(self.tokenizer, self.messages, self.tools, True, self.template)
        if not after.startswith(before):
            raise ValueError("the chat template does not extend the conversation by appending "
                             "(render(conversation + new) does not start with render(conversation))")
        self.segments.append(Segment(OBS, self.turns - 1, encode(self.tokenizer, after[len(before):])))

    def response(self) -> tuple[list[int], list[int], list[float]]:
        """(ids, mask, behaviour logprobs) of the response; logprobs 0 off the policy."""
        ids, mask, lp = [], [], []
        for s in self.segments:
            ids += s.ids
            mask += [1 if s.kind == POLICY else 0] * len(s.ids)
            lp += s.logprobs if s.kind == POLICY else [0.0] * len(s.ids)
        return ids, mask, lp

    def versions(self) -> list[int]:
        """The weight version that sampled each response token; -1 off the policy."""
        return [v for s in self.segments for v in [s.version if s.kind == POLICY else -1] * len(s.ids)]

    def cut(self, max_tokens: int) -> None:
        """Truncated at the budget: drop trailing non-policy segments past it."""
        self.truncated = True
        while self.response_len > max_tokens and self.segments[-1].kind != POLICY:
            self.segments.pop()

    def turn_ends(self) -> list[int]:
        """Response index of each policy turn's last token."""
        out, pos = [], 0
        for s in self.segments:
            pos += len(s.ids)
            if s.kind == POLICY:
                out.append(pos - 1)
        return out

    def check(self) -> list[Mismatch]:
        """Re-render the whole conversation; per segment, where its tokens differ."""
        gen = bool(self.segments) and self.segments[-1].kind == OBS
        full = encode(self.tokenizer, render(self.tokenizer, self.messages, self.tools, gen, self.template))
        if full[:len(self.prompt_ids)] != self.prompt_ids:
            return [Mismatch("prompt", -1, 0)]
        expect = full[len(self.prompt_ids):]
        out, pos = [], 0
        for s in self.segments:
            got = expect[pos:pos + len(s.ids)]
            if got != s.ids:
                out.append(Mismatch(s.kind, s.turn, pos))
            pos += len(s.ids)
        if pos != len(expect) and not out and not self.truncated:
            out.append(Mismatch("end", self.turns - 1, pos))
        return out
