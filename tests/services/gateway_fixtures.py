"""Test fixtures for tool calling, streaming and the gateway: a ChatML-with-tools template
for the byte tokenizer (its end-of-turn is `<eos>`), and an engine whose outputs can be
scripted.

Why a scripted engine: a tiny random model never writes a `<tool_call>` block, so the
tests that need tool calls script the text the engine returns. Everything else is real:
the scripted text is tokenized to ids + EOS, and its logprobs are the real model's
log_softmax(logits / T) of those ids (teacher-forced), the numbers the engine would report
had it sampled them. Without a script the real engine samples. Every output is recorded.
"""

from __future__ import annotations

import threading
from typing import Callable

import httpx

import torch

from baton.models.tiny import build_tiny_model
from baton.models.tokenizer import build_char_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import Completion, SamplingParams

CHATML_TOOLS = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "<tools>{% for t in tools %}{{ t.function.name }}{% endfor %}</tools>{{ eos_token }}\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}{{ eos_token }}\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}{% if m.content or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}{{ eos_token }}\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response>{{ eos_token }}\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}{{ eos_token }}\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MULTIPLY_TOOL = {"type": "function", "function": {
    "name": "multiply", "description": "a times b",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def tools_tokenizer():
    tok = build_char_tokenizer()
    tok.chat_template = CHATML_TOOLS
    return tok


def tiny_model(seed: int = 0) -> torch.nn.Module:
    return build_tiny_model(None, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, max_position=1024,
                            seed=seed).eval()


class ScriptedEngine(EmbeddedEngine):
    """`script(prompt_text) -> str | None`: the text to return (None: sample for real).
    Its scripted text ignores grammars, so it does not claim constrained decoding: a forced
    tool_choice is prefilled (the fallback for such engines)."""

    structured_outputs = False

    def __init__(self, model, tokenizer, script: Callable[[str], str | None] | None = None):
        super().__init__(model, tokenizer)
        self.script = script
        self.record: list[tuple[list[int], Completion]] = []  # (prompt ids, completion) of every output

    def generate(self, prompts, params: SamplingParams, should_stop=None):
        texts = [self.script(self.tokenizer.decode(p, skip_special_tokens=False)) if self.script else None
                 for p in prompts]
        if all(t is None for t in texts):
            outs = super().generate(prompts, params, should_stop)
        else:
            outs = []
            for i, (p, t) in enumerate(zip(prompts, texts)):
                for _ in range(params.n):
                    ids = list(self.tokenizer(t, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
                    outs.append(Completion(i, ids, self._forced_logprobs(p, ids, params.temperature), "stop",
                                           self.version))
        for c in outs:
            self.record.append((list(prompts[c.prompt_index]), c))
        return outs

    @torch.no_grad()
    def _forced_logprobs(self, prompt: list[int], ids: list[int], temperature: float) -> list[float]:
        x = torch.tensor([prompt + ids])
        logits = self.model(input_ids=x).logits[0, len(prompt) - 1:-1].float()  # [R, V]
        if temperature > 0:
            logits = logits / temperature
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        return lp.tolist()


class SlowTokenizer:
    """A tokenizer whose encoding waits for `gate` (a huge prompt being tokenized);
    `entered` is set once an encoding has started."""

    def __init__(self, tok):
        self.tok, self.gate, self.entered = tok, threading.Event(), threading.Event()

    def __call__(self, *a, **kw):
        self.entered.set()
        self.gate.wait(30)
        return self.tok(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.tok, name)


HUNDRED_MB = 100 << 20
JSON = {"Content-Type": "application/json"}


def _chunks(total: int, sent: list[int], size: int = 1 << 20):
    for _ in range(total // size):
        sent[0] += size
        yield b" " * size


def post_huge(url: str, declared: bool, sent: list[int] | None = None) -> httpx.Response:
    """A 100 MB chat body, with its Content-Length or chunked; the server may close the
    connection while the client still sends, so the answer is read from what came back.
    `sent[0]` counts the bytes the client got to hand to the connection."""
    headers = {**JSON, "Content-Length": str(HUNDRED_MB)} if declared else JSON
    return httpx.post(url, content=_chunks(HUNDRED_MB, sent if sent is not None else [0]), headers=headers,
                      timeout=120)
