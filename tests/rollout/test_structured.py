"""Structured outputs by constrained decoding: an untrained tiny model (real Qwen2 weights,
random) forced by a grammar (llguidance) writes tool calls that parse and match the
function's schema, JSON that matches a response_format schema, text that matches a regex;
the logprobs it records are those of the masked distribution it sampled from; through the
engine, `baton serve` with the official `openai` client, and the gateway."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
import torch

from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.grammars import closed, regex_grammar, response_format_grammar, tool_call_grammar
from baton.protocol import SamplingParams
from baton.rollout.server import ServerThread, build_app
from baton.rollout.server.tools import parse_tool_calls
from baton.services.gateway import Gateway
from baton.services.gateway_engines import InProcessEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from services.gateway_fixtures import MULTIPLY_TOOL, tiny_model, tools_tokenizer  # noqa: E402

llguidance = pytest.importorskip("llguidance")  # the `structured` extra (in the test extra)
jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")

ARGS = MULTIPLY_TOOL["function"]["parameters"]
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


def test_closed_schema_hand_worked():
    # objects that list properties and say nothing of others are closed, all the way down
    assert closed({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}) == {
        "type": "object", "additionalProperties": False,
        "properties": {"a": {"type": "object", "properties": {}, "additionalProperties": False}}}
    assert closed({"type": "object", "properties": {}, "additionalProperties": True})["additionalProperties"]
    assert closed({"anyOf": [{"properties": {}}]}) == {"anyOf": [{"properties": {}, "additionalProperties": False}]}
    assert closed({"type": "object"}) == {"type": "object"}  # json_object: any object


def test_grammar_texts():
    g = tool_call_grammar([MULTIPLY_TOOL, ADD_TOOL], "add")
    assert g.startswith('start: call\ncall: "<tool_call>" "\\n"? args "\\n"? "</tool_call>"\nargs: %json ')
    body = json.loads(g.split("%json ", 1)[1])
    assert body["properties"]["name"] == {"const": "add"} and "anyOf" not in body
    assert body["x-guidance"] == {"whitespace_pattern": " ?"}  # at most one space between tokens
    req = tool_call_grammar([MULTIPLY_TOOL, ADD_TOOL])  # "required": one or more calls of either
    assert req.startswith('start: call ("\\n" call)*\n') and len(json.loads(req.split("%json ", 1)[1])["anyOf"]) == 2
    assert regex_grammar("a/b+") == "start: /a\\/b+/"
    assert response_format_grammar({"type": "text"}) is None and response_format_grammar(None) is None
    for bad in ({"type": "xml"}, {"type": "json_schema"}, "json", {"type": "json_schema", "json_schema": {}}):
        with pytest.raises(ValueError):
            response_format_grammar(bad)
    with pytest.raises(ValueError, match="no tool named"):
        tool_call_grammar([MULTIPLY_TOOL], "divide")


@pytest.fixture(scope="module")
def engine():
    return EmbeddedEngine(tiny_model(0), tools_tokenizer())


def _prompt(tok, text="6*7?") -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_untrained_model_writes_schema_valid_calls(engine):
    tok = engine.tokenizer
    outs = engine.generate([_prompt(tok)], SamplingParams(n=6, max_new_tokens=160, seed=1,
                                                          grammar=tool_call_grammar([MULTIPLY_TOOL], "multiply")))
    finished = [c for c in outs if c.finish_reason == "stop"]
    assert len(finished) >= 4  # the rest ran out of tokens (a long integer), as OpenAI's "length"
    for c in finished:
        assert c.token_ids[-1] == tok.eos_token_id  # the grammar ends with EOS, as a turn does
        content, calls = parse_tool_calls(tok.decode(c.token_ids, skip_special_tokens=True))
        assert content == "" and len(calls) == 1 and calls[0]["function"]["name"] == "multiply"
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), ARGS)
    # without the grammar the same model writes no call at all
    free = engine.generate([_prompt(tok)], SamplingParams(n=6, max_new_tokens=40, seed=1))
    assert not any(parse_tool_calls(tok.decode(c.token_ids))[1] for c in free)


def test_logprobs_are_the_masked_distributions(engine):
    """Each recorded logprob is log_softmax of the grammar-masked logits (teacher-forced
    here with a fresh matcher): the distribution the token was drawn from."""
    from baton.rollout.constrained import Guide

    tok = engine.tokenizer
    prompt, grammar = _prompt(tok), response_format_grammar({"type": "json_schema", "json_schema": {"schema": PERSON}})
    (c,) = engine.generate([prompt], SamplingParams(max_new_tokens=60, seed=3, temperature=0.7, grammar=grammar))
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1:-1].float()
    guide = Guide(grammar, tok, logits.shape[-1], engine.eos_token_ids, 1)
    expected = []
    for t, tid in enumerate(c.token_ids):
        masked = guide.mask(logits[t:t + 1] / 0.7, [0])
        expected.append(torch.log_softmax(masked, -1)[0, tid].item())
        guide.advance([0], [tid])
    torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(expected), atol=2e-4, rtol=0)
    assert expected[0] == 0.0  # '{' is the only token a JSON object may start with: forced, logprob 0
    jsonschema.validate(json.loads(tok.decode(c.token_ids, skip_special_tokens=True)), PERSON)


@pytest.fixture(scope="module")
def server(engine):
    thread = ServerThread(build_app(engine, engine.tokenizer, "tiny"))
    yield thread.url
    thread.stop()


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "multiply"}}])
def test_forced_tool_choice_through_the_openai_client(server, tool_choice):
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "6*7?"}], n=3, seed=1,
                                       max_tokens=200, tools=[MULTIPLY_TOOL, ADD_TOOL], tool_choice=tool_choice)
    finished = [ch for ch in r.choices if ch.finish_reason == "tool_calls"]
    assert len(finished) >= 2
    for ch in finished:
        assert ch.message.tool_calls and not ch.message.content
        for call in ch.message.tool_calls:
            schema = {"multiply": ARGS, "add": ADD_TOOL["function"]["parameters"]}[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), schema)
            if isinstance(tool_choice, dict):
                assert call.function.name == "multiply"
    # streamed: the call comes as a tool_calls delta, nothing of it as content
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "6*7?"}], seed=1,
                                                 max_tokens=200, tools=[MULTIPLY_TOOL], tool_choice=tool_choice,
                                                 stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "multiply"


def test_response_format_json_schema_and_object(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "who?"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, n=3, seed=2, max_tokens=80, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    done = [ch for ch in r.choices if ch.finish_reason == "stop"]
    assert len(done) >= 2
    for ch in done:
        jsonschema.validate(json.loads(ch.message.content), PERSON)
    r = client.chat.completions.create(model="tiny", messages=msgs, seed=2, max_tokens=80,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    bad = client.with_options(max_retries=0)
    with pytest.raises(openai.BadRequestError, match="two different answers"):
        bad.chat.completions.create(model="tiny", messages=msgs, tools=[MULTIPLY_TOOL], tool_choice="required",
                                    response_format={"type": "json_object"})


def test_generate_regex_and_json_schema(server):
    with httpx.Client(base_url=server, timeout=60) as c:
        r = c.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": {
            "regex": "[0-9]{3}-[a-z]{2}", "max_new_tokens": 12, "seed": 0}}).json()
        assert r["meta_info"]["finish_reason"]["type"] == "stop"
        import re
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", r["text"])
        r = c.post("/generate", json={"input_ids": [5, 6], "sampling_params": {
            "json_schema": json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                       "required": ["ok"]}), "max_new_tokens": 20}})
        assert json.loads(r.json()["text"])["ok"] in (True, False)
        r = c.post("/generate", json={"input_ids": [5], "sampling_params": {"grammar": "start: %json {"}})
        assert r.status_code == 400 and "grammar" in r.json()["error"]["message"]
        r = c.post("/generate", json={"input_ids": [5], "sampling_params": {"regex": "a", "json_schema": "{}"}})
        assert r.status_code == 400 and "one of" in r.json()["error"]["message"]


def test_missing_extra_is_one_line(server, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # as if `structured` were not installed
    r = httpx.post(server + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                          "response_format": {"type": "json_object"}}, timeout=30)
    assert r.status_code == 400
    assert "pip install 'baton-rl[structured]'" in r.json()["error"]["message"]


def test_gateway_forced_call_is_the_policys_own(engine):
    """In a gateway session a forced call is sampled under the grammar: every token is the
    policy's (mask 1) with the masked distribution's logprob, and the call parses."""
    tok = engine.tokenizer
    gw = Gateway(InProcessEngine(engine), tok, model_name="m")
    thread = ServerThread(gw.app())
    try:
        sid = httpx.post(f"{thread.url}/sessions").json()["session_id"]
        client = openai.OpenAI(base_url=f"{thread.url}/sessions/{sid}/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "6*7?"}], seed=4,
                                           max_tokens=200, tools=[MULTIPLY_TOOL], tool_choice="required")
        assert r.choices[0].finish_reason == "tool_calls"
        jsonschema.validate(json.loads(r.choices[0].message.tool_calls[0].function.arguments), ARGS)
        traj = httpx.get(f"{thread.url}/sessions/{sid}").json()
        sampled = traj["tokens"][traj["prompt_len"]:]
        assert all(traj["mask"][traj["prompt_len"]:]) and tok.decode(sampled).startswith("<tool_call>")
        assert traj["logprobs"][traj["prompt_len"]] == 0.0  # '<' was the only token allowed: forced
    finally:
        thread.stop()


@pytest.mark.parametrize("where,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                          "schema": {"$ref": "#"}}}}),
    ("/generate", {"input_ids": [5], "sampling_params": {"regex": "[^\\s\\S]"}}),
    ("/generate", {"input_ids": [5], "sampling_params": {"grammar": "start: /[^\\s\\S]/ | /[^\\s\\S]+/"}}),
])
def test_a_grammar_that_matches_nothing_is_a_400_naming_it(server, where, body):
    """Issue 50.3: before, 200 with empty text and finish_reason "stop"."""
    r = httpx.post(server + where, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert "matches no text at all" in r.json()["error"]["message"]


def test_a_grammar_failing_mid_way_is_its_own_finish_reason_never_stop(engine, server):
    """A grammar whose language is empty past a prefix ("a", then a rule with no base case)
    passes the check (its first token exists); its row ends with grammar_error, not "stop"."""
    grammar = 'start: "a" b\nb: b "x"'
    (c,) = engine.generate([_prompt(engine.tokenizer)], SamplingParams(max_new_tokens=8, grammar=grammar))
    assert c.finish_reason == "grammar_error"
    r = httpx.post(server + "/generate", json={"input_ids": [5], "sampling_params": {"grammar": grammar}},
                   timeout=30).json()
    assert r["meta_info"]["finish_reason"]["type"] == "grammar_error"


def test_the_grammar_check_runs_off_the_event_loop(server, monkeypatch):
    """Issue 50.4: a check that takes long (a big schema: ~0.8 s of CPU per 3 MB) never holds
    /health. The check is held on an event here (a stand-in for a slow compile that the test
    controls, no timing race): /health answers while it is held; the request then goes on."""
    import threading

    from baton.rollout import constrained

    held, entered = threading.Event(), threading.Event()
    real = constrained.check_grammar

    def slow_check(grammar):
        entered.set()
        held.wait(60)
        return real(grammar)

    monkeypatch.setattr(constrained, "check_grammar", slow_check)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "response_format": {"type": "json_object"}}
    chat = threading.Thread(target=lambda: httpx.post(server + "/v1/chat/completions", json=body, timeout=90))
    chat.start()
    try:
        assert entered.wait(30)
        assert httpx.get(server + "/health", timeout=10).status_code == 200  # before: timed out
    finally:
        held.set()
        chat.join(90)


def test_grammars_are_checked_once_by_hash(monkeypatch):
    from baton.rollout import constrained

    calls = []
    real = constrained._grammar_error
    monkeypatch.setattr(constrained, "_grammar_error", lambda llg, g: calls.append(g) or real(llg, g))
    grammar = regex_grammar("[0-9]{4}-cache-test")
    for _ in range(3):
        constrained.check_grammar(grammar)
    for _ in range(2):
        with pytest.raises(ValueError, match="matches no text"):
            constrained.check_grammar(regex_grammar("[^\\s\\S]{2}"))
    assert calls == [grammar, regex_grammar("[^\\s\\S]{2}")]
