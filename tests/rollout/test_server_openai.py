"""`baton serve` as the official `openai` client sees it (issue 30): every error in OpenAI's
shape `{"error": {"message", "type", "param", "code"}}`, so the client's exception names the
reason, and `top_logprobs` up to 20 (chat) / `logprobs` up to 20 (completions) as vLLM's
server gives them. Real uvicorn on 127.0.0.1, the tiny model, the real client."""

from __future__ import annotations

import math

import httpx
import pytest

openai = pytest.importorskip("openai")

HI = [{"role": "user", "content": "hi"}]


def _client(url: str, key: str = "unused"):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


@pytest.mark.parametrize("kwargs,error,status,needle,param,code", [
    ({"model": "gpt-4"}, "NotFoundError", 404, "tiny-qwen", "model", "model_not_found"),
    ({"max_tokens": 1000}, "BadRequestError", 400, "context of 256", None, "context_length_exceeded"),
    ({"temperature": -1.0}, "UnprocessableEntityError", 422, "greater than or equal to 0", "temperature", None),
    ({"extra_body": {"presence_penalty": 0.5}}, "BadRequestError", 400, "presence_penalty", None, None),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "UnprocessableEntityError", 422, "messages.0.role",
     "messages.0.role", None),
])
def test_the_official_client_shows_each_errors_reason(served, kwargs, error, status, needle, param, code):
    kw = {"model": "tiny-qwen", "messages": HI, "max_tokens": 2, **kwargs}
    with pytest.raises(openai.APIStatusError) as exc:
        _client(served.url).chat.completions.create(**kw)
    e = exc.value
    assert type(e).__name__ == error and e.status_code == status
    assert needle in str(e), str(e)  # "Error code: 404 - model 'gpt-4' is not served here; ..."
    assert (e.param, e.code, e.type is not None) == (param, code, True), e.body


def test_errors_before_any_route_are_openai_shaped_too(fresh_served):
    s = fresh_served(api_key="sekrit", max_body_bytes=1 << 16)
    with pytest.raises(openai.AuthenticationError) as exc:
        _client(s.url, "wrong").chat.completions.create(model="tiny-qwen", messages=HI, max_tokens=2)
    assert "invalid API key" in str(exc.value) and exc.value.code == "invalid_api_key"
    with pytest.raises(openai.APIStatusError) as exc:
        _client(s.url, "sekrit").chat.completions.create(model="tiny-qwen", max_tokens=2,
                                                          messages=[{"role": "user", "content": "x" * 70_000}])
    assert exc.value.status_code == 413 and "exceeds" in str(exc.value) and exc.value.code == "body_too_large"
    with httpx.Client(base_url=s.url, headers={"Authorization": "Bearer sekrit"}, timeout=60) as c:
        r = c.get("/no/such/route")
        assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found"
        r = c.post("/v1/completions", content=b'{"prompt": NaN}', headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "NaN" in r.json()["error"]["message"], r.text
        r = c.post("/v1/completions", content=b'{"prompt": ', headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "not valid JSON" in r.json()["error"]["message"], r.text
        r = c.post("/update_weights_from_disk", json={"model_path": "/nope.safetensors"})  # SGLang's shape + OpenAI's
        assert r.status_code == 400 and not r.json()["success"] and "not found" in r.json()["error"]["message"]


def test_top_logprobs_up_to_20(served):
    """Greedy: the chosen token is the most likely one, so it heads its alternatives, with the
    engine's own logprob; the alternatives are sorted and are log-probabilities."""
    client = _client(served.url)
    r = client.chat.completions.create(model="tiny-qwen", messages=HI, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=20, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        alts = entry.top_logprobs
        assert len(alts) == 20  # (byte tokens: several decode to the same replacement character)
        values = [a.logprob for a in alts]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert alts[0].token == entry.token and alts[0].logprob == entry.logprob
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-4
    comp = client.completions.create(model="tiny-qwen", prompt="1+1=", max_tokens=3, temperature=0, logprobs=5,
                                     extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    lp = comp.choices[0].logprobs
    assert all(len(top) >= 5 and top[tok] == v for top, tok, v in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs))
