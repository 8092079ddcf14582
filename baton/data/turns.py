"""Where an assistant turn ends: the text a chat template writes after an assistant
message's content, and what a sampled turn needs appended to end exactly that way.

    close = assistant_close(tokenizer)               # Qwen2.5: "<|im_end|>\\n", Llama-3: "<|eot_id|>"
    text = boundary_after(tokenizer, sampled_ids, close)

Used by the agent trajectories (baton.agents.tokens) and the OpenAI gateway
(baton.services.gateway) to close a turn, whatever ended it: the model's end-of-turn token
(then only the rest of `close`, ChatML's "\\n"), a stop string (which may end inside a
token), max_tokens or the engine's length limit (all of `close`). Sampled ids are kept as
sampled; only the appended text is tokenized.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

_MARK = "BATONASSISTANTCONTENT"


@lru_cache(maxsize=64)  # one render per (tokenizer, template): asked for every trajectory and every turn
def assistant_close(tokenizer: Any, template: str | None = None) -> str:
    """What the chat template (`template`, else the tokenizer's) writes after an assistant
    message's content, found by rendering one."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}],
                                         tokenize=False, add_generation_prompt=False, chat_template=template)
    if _MARK not in text:
        raise ValueError("the chat template does not write an assistant message's content")
    return text[text.rfind(_MARK) + len(_MARK):]


def boundary_after(tokenizer: Any, sampled: list[int], close: str) -> str:
    """The text that closes a turn after its sampled ids as the template closes an assistant
    message (`close`): less the end-of-turn token when the model sampled it (a special token
    `close` starts with), all of it otherwise."""
    if sampled and sampled[-1] in _special_ids(tokenizer):
        last = tokenizer.decode(sampled[-1:], skip_special_tokens=False)
        if last and close.startswith(last):
            return close[len(last):]
    return close


@lru_cache(maxsize=64)
def _special_ids(tokenizer: Any) -> frozenset[int]:
    return frozenset(tokenizer.all_special_ids)  # a property HF recomputes on every access
