"""`baton serve` over real HTTP: every endpoint, batching of concurrent clients,
malformed input, a client that disconnects, weight reload from disk, sleep/wake."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from baton.sync import check_logprob_parity, save_safetensors_atomic

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


def _greedy_ref(served, prompts, max_new=6):
    """What the engine itself returns for these prompts (greedy)."""
    return served.engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True))


def test_health_models_info(served):
    with httpx.Client(base_url=served.url, timeout=60) as c:
        h = c.get("/health")
        assert h.status_code == 200
        assert h.json() == {"status": "ok", "version": 0, "model": "tiny-qwen", "model_path": None,
                            "weights_path": None}
        models = c.get("/v1/models").json()
        assert models["object"] == "list" and models["data"][0]["id"] == "tiny-qwen"
        assert c.get("/get_model_info").json()["is_generation"] is True
        assert c.get("/get_weight_version").json() == {"weight_version": 0}


def test_generate_single_and_batch(served):
    ref = _greedy_ref(served, [[5, 6, 7], [8, 9]])
    with httpx.Client(base_url=served.url, timeout=60) as c:
        one = c.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": GREEDY,
                                        "return_logprob": True}).json()
        assert isinstance(one, dict)  # single prompt, n == 1 -> an object, as SGLang
        assert one["output_ids"] == ref[0].token_ids
        lps = [x[0] for x in one["meta_info"]["output_token_logprobs"]]
        assert lps == pytest.approx(ref[0].logprobs, abs=1e-5)
        assert [x[1] for x in one["meta_info"]["output_token_logprobs"]] == ref[0].token_ids
        assert one["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
        assert one["meta_info"]["prompt_tokens"] == 3 and one["meta_info"]["weight_version"] == 0

        many = c.post("/generate", json={"input_ids": [[5, 6, 7], [8, 9]],
                                         "sampling_params": {**GREEDY, "n": 2}}).json()
        assert [m["output_ids"] for m in many] == [ref[0].token_ids] * 2 + [ref[1].token_ids] * 2  # prompt-major
        assert "output_token_logprobs" not in many[0]["meta_info"]


def test_generate_text_stop_and_seed(served, srv_tokenizer):
    with httpx.Client(base_url=served.url, timeout=60) as c:
        ids = c.post("/generate", json={"text": "1+2=", "sampling_params": GREEDY}).json()["output_ids"]
        full = srv_tokenizer.decode(ids, skip_special_tokens=True)
        stop = full[2:4] if len(full) >= 4 else full[-1:]
        out = c.post("/generate", json={"text": "1+2=", "sampling_params": {**GREEDY, "stop": stop}}).json()
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        assert stop not in out["text"] and full.startswith(out["text"])
        body = {"input_ids": [[5, 6], [7]], "sampling_params": {"max_new_tokens": 8, "n": 2, "sampling_seed": 3}}
        a, b = c.post("/generate", json=body).json(), c.post("/generate", json=body).json()
        assert [x["output_ids"] for x in a] == [x["output_ids"] for x in b]


def test_openai_completions(served, srv_tokenizer):
    prompt_ids = srv_tokenizer("12+7=")["input_ids"]
    ref = _greedy_ref(served, [prompt_ids], max_new=5)[0]
    with httpx.Client(base_url=served.url, timeout=60) as c:
        body = {"model": "tiny-qwen", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
        r = c.post("/v1/completions", json={**body, "prompt": "12+7=", "logprobs": 1}).json()
        ch = r["choices"][0]
        assert r["object"] == "text_completion" and ch["finish_reason"] == "length"
        assert ch["logprobs"]["token_logprobs"] == pytest.approx(ref.logprobs, abs=1e-5)
        assert r["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": 5,
                              "total_tokens": len(prompt_ids) + 5}
        # vLLM-style token-id prompts, two of them, n = 2, ids back
        r = c.post("/v1/completions", json={**body, "prompt": [prompt_ids, [9, 10]], "n": 2, "logprobs": 0,
                                            "return_token_ids": True, "return_tokens_as_token_ids": True}).json()
        assert len(r["choices"]) == 4 and [x["index"] for x in r["choices"]] == [0, 1, 2, 3]
        assert r["choices"][0]["token_ids"] == ref.token_ids
        assert r["choices"][0]["logprobs"]["tokens"] == [f"token_id:{t}" for t in ref.token_ids]
        assert r["choices"][2]["prompt_token_ids"] == [9, 10]


def test_openai_chat(served, srv_tokenizer):
    messages = [{"role": "user", "content": "3+4="}]
    text = srv_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ref = _greedy_ref(served, [srv_tokenizer(text, add_special_tokens=False)["input_ids"]], max_new=4)[0]
    with httpx.Client(base_url=served.url, timeout=60) as c:
        r = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0,
                                                 "ignore_eos": True, "logprobs": True, "n": 2}).json()
    assert r["object"] == "chat.completion" and len(r["choices"]) == 2
    msg = r["choices"][1]["message"]
    assert msg["role"] == "assistant"
    assert msg["content"] == srv_tokenizer.decode(ref.token_ids, skip_special_tokens=True)
    assert [x["logprob"] for x in r["choices"][0]["logprobs"]["content"]] == pytest.approx(ref.logprobs, abs=1e-5)


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/completions", {"max_tokens": 3}, 422, "prompt"),  # missing field
    ("/v1/completions", {"prompt": "1", "temperature": -1}, 422, "temperature"),
    ("/v1/completions", {"prompt": "1", "top_p": 0}, 422, "top_p"),
    ("/v1/completions", {"prompt": "1", "n": "many"}, 422, "n"),
    ("/generate", {"input_ids": [1, 2], "stream": True}, 400, "stream"),  # /v1/* stream (test_server_tools.py)
    ("/v1/completions", {"prompt": "1", "frequency_penalty": 0.5}, 400, "frequency_penalty"),
    ("/v1/completions", {"prompt": []}, 400, "empty"),
    ("/v1/chat/completions", {"messages": []}, 422, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 422, "role"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_tokens": 3}}, 422, "max_tokens"),  # typo
    ("/generate", {"input_ids": [1, 2], "text": "a"}, 400, "exactly one"),
    ("/generate", {"sampling_params": {}}, 400, "exactly one"),
    ("/generate", {"input_ids": [1, 99999]}, 400, "outside"),
    ("/generate", {"input_ids": []}, 400, "empty"),
    ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}, 422, "max_new_tokens"),
    ("/generate", {"input_ids": [1], "sampling_params": {"ebnf": "root ::= 'a'"}}, 400, "ebnf"),  # regex: test_structured.py
    ("/update_weights_from_disk", {"model_path": "/nonexistent/w.safetensors"}, 400, "nonexistent"),
    ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]]}, 400,
     "init_weights_update_group"),
    ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 0,
                                    "world_size": 2}, 422, "rank_offset"),
])
def test_malformed_requests(served, path, body, status, needle):
    with httpx.Client(base_url=served.url, timeout=60) as c:
        r = c.post(path, json=body)
    assert r.status_code == status, r.text
    assert needle in r.text


def test_invalid_json(served):
    with httpx.Client(base_url=served.url, timeout=60) as c:
        r = c.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "json" in r.text.lower()


def test_concurrent_clients_are_batched(fresh_served):
    s = fresh_served(max_batch_wait_ms=20)
    prompts = [[5 + i, 6, 7 + (i % 3)] for i in range(12)]
    ref = _greedy_ref(s, prompts)

    async def run():
        async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:
            rs = await asyncio.gather(*[c.post("/generate", json={"input_ids": p, "sampling_params": GREEDY})
                                        for p in prompts])
        return [r.json() for r in rs]

    outs = asyncio.run(run())
    assert [o["output_ids"] for o in outs] == [r.token_ids for r in ref]  # each client got its own answer
    st = s.stats()
    assert st["requests"] == 12 and st["batches"] < 12 and st["max_batch_requests"] > 1


class SlowEngine(EmbeddedEngine):
    """An engine whose generate takes at least `delay` seconds (to hold requests in the queue)."""
    delay = 0.6

    def generate(self, prompts, params):
        time.sleep(self.delay)
        return super().generate(prompts, params)


def test_disconnecting_client_does_not_stall_others(fresh_served, srv_tokenizer, make_tiny_qwen):
    model = make_tiny_qwen(0)
    s = fresh_served(engine=SlowEngine(model, srv_tokenizer), model=model, max_batch_wait_ms=0)
    results = {}

    def busy():  # occupies the engine for ~0.6 s
        with httpx.Client(base_url=s.url, timeout=30) as c:
            results["busy"] = c.post("/generate", json={"input_ids": [5], "sampling_params": GREEDY}).status_code

    t = threading.Thread(target=busy)
    t.start()
    time.sleep(0.15)
    # queued behind the busy batch, then gives up: its request must be dropped, not run
    with httpx.Client(base_url=s.url, timeout=0.2) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/generate", json={"input_ids": [6], "sampling_params": {**GREEDY, "max_new_tokens": 7}})
    with httpx.Client(base_url=s.url, timeout=30) as c:
        assert c.get("/health").status_code == 200  # the event loop is free meanwhile
        r = c.post("/generate", json={"input_ids": [7], "sampling_params": {**GREEDY, "max_new_tokens": 5}})
    t.join()
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 5 and results["busy"] == 200
    st = s.stats()
    assert st["dropped"] == 1 and st["batches"] == 2  # busy batch + our own; the dropped one never ran


def test_engine_error_is_reported_not_fatal(fresh_served, srv_tokenizer, make_tiny_qwen):
    class Broken(EmbeddedEngine):
        def generate(self, prompts, params):
            if prompts[0][0] == 13:
                raise RuntimeError("boom")
            return super().generate(prompts, params)

    model = make_tiny_qwen(0)
    s = fresh_served(engine=Broken(model, srv_tokenizer), model=model)
    with httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post("/generate", json={"input_ids": [13], "sampling_params": GREEDY})
        assert r.status_code == 500 and "boom" in r.text
        assert c.post("/generate", json={"input_ids": [14], "sampling_params": GREEDY}).status_code == 200


def test_update_weights_from_disk(fresh_served, tmp_path, make_tiny_qwen):
    s = fresh_served()
    trainer = make_tiny_qwen(1)  # different weights from the served model
    prompt = [5, 9, 11, 4]
    assert check_logprob_parity(s.engine, trainer, prompt) > 1e-2
    path = save_safetensors_atomic(trainer.named_parameters(), tmp_path / "w.safetensors")
    with httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post("/update_weights_from_disk", json={"model_path": str(path), "version": 3}).json()
        assert r["success"] is True and r["version"] == 3
        assert c.get("/health").json()["version"] == 3
        out = c.post("/generate", json={"input_ids": prompt, "sampling_params": GREEDY}).json()
    assert out["meta_info"]["weight_version"] == 3
    assert check_logprob_parity(s.engine, trainer, prompt) < 1e-4
    # an HF checkpoint directory works too (SGLang's usual model_path), weight_version as a string
    trainer2 = make_tiny_qwen(2)
    trainer2.save_pretrained(tmp_path / "ckpt")
    with httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "ckpt"), "weight_version": "4"})
    assert r.json()["version"] == 4
    assert check_logprob_parity(s.engine, trainer2, prompt) < 1e-4


def test_sleep_wake(fresh_served):
    s = fresh_served()
    with httpx.Client(base_url=s.url, timeout=60) as c:
        assert c.post("/release_memory_occupation", json={}).json()["success"]
        r = c.post("/generate", json={"input_ids": [5], "sampling_params": GREEDY})
        assert r.status_code == 503 and "asleep" in r.text  # the server's state, not the client's fault
        assert c.get("/health").json()["status"] == "sleeping"
        assert c.post("/resume_memory_occupation", json={}).json()["success"]
        assert c.post("/generate", json={"input_ids": [5], "sampling_params": GREEDY}).status_code == 200
