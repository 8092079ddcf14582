"""The turn boundary: whatever ended a turn (the model's end-of-turn token, a stop string that
ends inside a token, max_tokens), the tokens after the sampled ones are exactly what the real
Qwen2.5 / Llama-3 chat templates write after an assistant message, mask 0; the sampled ids
keep their logprobs. Through the gateway (how it closes a session's turn) and `Conversation`.

`StopEngine` stands in for a trained policy (a random tiny model cannot be made to write a
given text): it "samples" a fixed text and applies stop strings, EOS and max_tokens as the
embedded engine does (the turn ends with the token that completes the stop string)."""

from __future__ import annotations

import asyncio

import pytest

from baton.agents.tokens import Conversation, encode
from baton.data.turns import assistant_close
from baton.rollout.server.schemas import ChatCompletionRequest
from baton.services.gateway import Gateway
from baton.services.gateway_engines import Sampled

TEXT = "I can calcan do it"


class StopEngine:
    def __init__(self, tok, text: str = TEXT, eos: bool = True):
        self.tok, self.text, self.eos = tok, text, eos

    async def sample(self, ids, params):
        out, finish = [], "length"
        for t in encode(self.tok, self.text) + ([self.tok.eos_token_id] if self.eos else []):
            if len(out) == params.max_new_tokens:
                break
            out.append(t)
            if t == self.tok.eos_token_id or any(s in self.tok.decode(out) for s in params.stop or []):
                finish = "stop"
                break
        return Sampled(out, [-0.5 - 0.01 * i for i in range(len(out))], finish, 0)


def _two_turns(tok, engine, **first):
    """A session of two requests; (its tokens, mask, logprobs, sampled ids of turn 1, the
    tokens the gateway inserted between the turns)."""
    gw = Gateway(engine, tok)
    s = gw.new_session()
    msgs = [{"role": "user", "content": "help"}]
    reply = asyncio.run(gw.chat(s.id, ChatCompletionRequest(model="baton", messages=msgs, **first)))
    sampled, start = list(s.last_sampled), len(s.tokens)
    msgs += [reply["choices"][0]["message"], {"role": "user", "content": "go on"}]
    asyncio.run(gw.chat(s.id, ChatCompletionRequest(model="baton", messages=msgs, max_tokens=2)))
    nxt = s.tokens.index(tok.convert_tokens_to_ids(NEXT[tok.eos_token]), start)
    return s, sampled, s.tokens[start:nxt]


NEXT = {"<|im_end|>": "<|im_start|>", "<|eot_id|>": "<|start_header_id|>"}  # the next message's first token
CLOSE = {"<|im_end|>": "<|im_end|>\n", "<|eot_id|>": "<|eot_id|>"}


@pytest.fixture(params=["qwen_tok", "llama_tok"])
def tok(request):
    tok = request.getfixturevalue(request.param)
    tok.add_tokens(["calcan"])  # a stop string "calca" ends inside this token
    return tok


def test_assistant_close_is_what_the_real_templates_write(qwen_tok, llama_tok):
    assert assistant_close(qwen_tok) == "<|im_end|>\n" and assistant_close(llama_tok) == "<|eot_id|>"


@pytest.mark.parametrize("how", ["stop string inside a token", "eos", "max_tokens"])
def test_the_gateway_closes_every_turn_as_the_template_does(tok, how):
    first = {"stop string inside a token": {"stop": ["calca"]}, "eos": {}, "max_tokens": {"max_tokens": 4}}[how]
    s, sampled, inserted = _two_turns(tok, StopEngine(tok), **first)
    close = CLOSE[tok.eos_token]
    if how == "stop string inside a token":
        assert tok.decode(sampled).endswith("calcan")  # kept as sampled, the stop string and all
    if how == "eos":
        assert sampled[-1] == tok.eos_token_id and tok.decode(inserted) == close[len(tok.eos_token):]
    else:  # before: "...calcan" + "an" + "\n", or no end-of-turn token at all
        assert tok.decode(inserted) == close and inserted == encode(tok, close)
    i = s.tokens.index(sampled[0], s.prompt_len)
    assert s.tokens[i:i + len(sampled)] == sampled and s.mask[i:i + len(sampled)] == [1] * len(sampled)
    assert s.logprobs[i:i + len(sampled)] == [-0.5 - 0.01 * k for k in range(len(sampled))]
    j = i + len(sampled)
    assert s.mask[j:j + len(inserted)] == [0] * len(inserted)
    assert s.logprobs[j:j + len(inserted)] == [0.0] * len(inserted)


def test_a_trajectory_closes_a_cut_turn_as_the_template_does(tok):
    traj = Conversation(tok, [{"role": "user", "content": "help"}])
    ids = encode(tok, "I can")
    traj.add_turn(ids, [-0.5] * len(ids), "I can")  # cut by max_tokens: no end-of-turn token
    assert tok.decode(traj.segments[1].ids) == CLOSE[tok.eos_token] and traj.check() == []
