"""`ScriptedEngine`: a stand-in for a *trained* policy (a random tiny model cannot be made to
call tools on cue) for the agent tests; it implements the engine protocol. A module of its
own: test_deadlines.py imported it from test_rollout.py, which then ran twice, and its
`register_env` entries with it, which the `AGENT_ENVS` registry refuses the second time."""

from __future__ import annotations

import re

from baton.protocol import Completion, Engine


class ScriptedEngine(Engine):
    """Calls calc on "a*b=" prompts, then answers with the tool's result; logs batch sizes."""

    def __init__(self, tokenizer, wrong_first: bool = False):
        self.tok, self.version, self.calls = tokenizer, 3, []
        self.eos_token_ids = [tokenizer.eos_token_id]

    def _reply(self, text: str) -> str:
        if "guess" in text:
            return "10"
        results = re.findall(r"<tool_response>\n(\d+)", text)
        if results:
            return results[-1]
        expr = re.findall(r"(\d+\*\d+)=", text)[-1]
        return '<tool_call>{"name": "calc", "arguments": {"expr": "%s"}}</tool_call>' % expr

    def generate(self, prompts, params):
        self.calls.append(len(prompts))
        out = []
        for i, ids in enumerate(prompts):
            t = self.tok(self._reply(self.tok.decode(ids)), add_special_tokens=False)["input_ids"]
            t = t[:params.max_new_tokens]
            stop = len(t) < params.max_new_tokens
            t = t + [self.tok.eos_token_id] if stop else t
            out.append(Completion(i, t, [-0.25] * len(t), "stop" if stop else "length", self.version))
        return out
