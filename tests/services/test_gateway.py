"""The OpenAI gateway: an agent written against the official `openai` client runs several
turns (one a tool call it executes itself) in session-scoped endpoints; its sessions become
training rows whose ids are exactly what the engine sampled, with mask 0 exactly on the
tokens the chat template inserted, and the behaviour logprobs as sampled."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
import torch

from baton import fields as F
from baton.rollout.server import ServerThread
from baton.services.gateway import Gateway
from baton.services.gateway_engines import HttpEngine, InProcessEngine
from baton.services.gateway_rows import GatewayRows

from .gateway_fixtures import MULTIPLY_TOOL, ScriptedEngine, post_huge, tiny_model, tools_tokenizer

openai = pytest.importorskip("openai")

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'


def _script(prompt: str) -> str | None:
    if "thanks" in prompt:
        return None  # the last turn: the real model samples
    return "The answer is 42." if "<tool_response>" in prompt else "calling\n" + CALL


def agent(base_url: str, gateway_url: str, session_id: str, follow_up: bool = True) -> float:
    """An OpenAI-speaking agent: asks, runs the tool the model calls, answers, reports a reward."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "6*7?"}]
    r = client.chat.completions.create(model="m", messages=messages, tools=[MULTIPLY_TOOL], max_tokens=80)
    msg = r.choices[0].message
    messages.append(msg.model_dump(exclude_none=True))
    for call in msg.tool_calls or []:
        args = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] * args["b"])})
    r = client.chat.completions.create(model="m", messages=messages, tools=[MULTIPLY_TOOL], max_tokens=40,
                                       stream=True)  # streamed: the gateway records it the same way
    answer = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
    reward = float("42" in answer)
    if follow_up:
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "thanks"}]
        client.chat.completions.create(model="m", messages=messages, tools=[MULTIPLY_TOOL], max_tokens=6)
    httpx.post(f"{gateway_url}/sessions/{session_id}/reward", json={"reward": reward}, timeout=60).raise_for_status()
    return reward


@pytest.fixture(scope="module")
def gateway():
    tok = tools_tokenizer()
    engine = ScriptedEngine(tiny_model(0), tok, _script)
    gw = Gateway(InProcessEngine(engine), tok, model_name="m")
    thread = ServerThread(gw.app())
    yield gw, engine, thread.url
    thread.stop()


def _run_agents(url: str, n: int, group: str, **kw) -> list[str]:
    ids = [httpx.post(f"{url}/sessions", json={"group": group}, timeout=60).json()["session_id"] for _ in range(n)]
    threads = [threading.Thread(target=agent, args=(f"{url}/sessions/{sid}/v1", url, sid), kwargs=kw) for sid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return ids


def test_agent_sessions_become_rows(gateway):
    gw, engine, url = gateway
    tok = gw.tok
    start = len(engine.record)
    ids = _run_agents(url, 2, "q1")
    trajs = {sid: httpx.get(f"{url}/sessions/{sid}", timeout=60).json() for sid in ids}
    calls = engine.record[start:]
    assert len(calls) == 6  # 2 sessions x 3 turns
    for t in trajs.values():
        assert t["turns"] == 3 and t["reward"] == 1.0 and t["boundary_mismatches"] == 0
        toks, mask, lps = t["tokens"], t["mask"], t["logprobs"]
        assert len(toks) == len(mask) == len(lps)
        # each engine call's prompt is the trajectory so far; its sampled ids follow it with mask 1
        # (both sessions' scripted turns are equal: one entry per span)
        mine = list({len(p): (p, c) for p, c in calls
                     if toks[:len(p)] == p and toks[len(p):len(p) + len(c.token_ids)] == c.token_ids}.values())
        assert len(mine) == 3
        sampled = set()
        for p, c in mine:
            span = range(len(p), len(p) + len(c.token_ids))
            sampled |= set(span)
            assert [mask[i] for i in span] == [1] * len(span)
            assert [lps[i] for i in span] == c.logprobs  # as sampled, not recomputed
        assert {i for i, m in enumerate(mask) if m} == sampled
        assert all(lps[i] == 0.0 for i in range(len(toks)) if not mask[i])
        # mask-0 tokens are exactly the template's: the trajectory is the template's rendering
        # of the whole conversation (plus the closing boundary it would add after the last turn)
        first_prompt = mine[0][0]
        assert t["prompt_len"] == len(first_prompt)
        text = tok.decode(toks, skip_special_tokens=False)
        assert text.startswith("<|im_start|>system\nbe brief\n<tools>multiply</tools><eos>\n<|im_start|>user\n6*7?")
        assert ('calling\n' + CALL + '<eos>\n<|im_start|>user\n<tool_response>42</tool_response><eos>\n'
                '<|im_start|>assistant\nThe answer is 42.<eos>\n<|im_start|>user\nthanks<eos>\n'
                '<|im_start|>assistant\n') in text
    # the rows of the group
    source = GatewayRows(gw, group_size=2, wait_s=10)
    rows = source.rows(1)
    assert rows[F.RESPONSE_IDS].shape[0] == 2
    matched = set()
    for i in range(2):
        rm = rows[F.RESPONSE_MASK][i]
        prompt = rows[F.PROMPT_IDS][i][rows[F.PROMPT_MASK][i].bool()].tolist()
        row_ids = rows[F.RESPONSE_IDS][i].tolist()
        sid = next(s for s, t in trajs.items() if s not in matched and t["tokens"][:t["prompt_len"]] == prompt
                   and row_ids[:len(t["tokens"]) - t["prompt_len"]] == t["tokens"][t["prompt_len"]:])
        matched.add(sid)
        t = trajs[sid]
        R = len(t["tokens"]) - t["prompt_len"]
        assert rm[:R].tolist() == t["mask"][t["prompt_len"]:] and rm[R:].sum() == 0
        assert rows[F.ROLLOUT_LOGPROBS][i][:R].tolist() == pytest.approx(t["logprobs"][t["prompt_len"]:], abs=1e-7)
        assert rows[F.FINISH_REASON][i] == t["finish_reason"]
    assert matched == set(ids)
    assert rows[F.REWARDS].tolist() == [1.0, 1.0]
    assert rows[F.POLICY_VERSION].tolist() == [0, 0]
    assert not gw.sessions  # taken
    assert source.state_dict()["sessions_used"] == 2


def test_session_errors(gateway):
    gw, _, url = gateway
    client = httpx.Client(base_url=url, timeout=60)
    assert client.post("/sessions/nope/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "x"}]}).status_code == 404
    sid = client.post("/sessions", json={}).json()["session_id"]
    assert client.post(f"/sessions/{sid}/reward", json={"reward": 1}).status_code == 400  # no turns yet
    body = {"messages": [{"role": "user", "content": "hi thanks"}], "max_tokens": 3}
    assert client.post(f"/sessions/{sid}/v1/chat/completions", json=body).status_code == 200
    # a history that does not continue the session
    r = client.post(f"/sessions/{sid}/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "x"},
                                       {"role": "user", "content": "more thanks"}], "max_tokens": 3})
    assert r.status_code == 400 and "start a new session" in r.json()["error"]["message"]
    r = client.post(f"/sessions/{sid}/v1/chat/completions", json={**body, "n": 2})
    assert r.status_code == 400
    assert client.post(f"/sessions/{sid}/reward", json={"reward": 0.5}).status_code == 200
    assert client.post(f"/sessions/{sid}/reward", json={"reward": 0.5}).status_code == 409
    assert client.post(f"/sessions/{sid}/v1/chat/completions", json=body).status_code == 409
    gw.take(1, timeout_s=1)  # leave the module's gateway empty
    with pytest.raises(TimeoutError):
        gw.take(1, timeout_s=0.05)


def test_gateway_over_baton_serve(gateway):
    """The engine behind the gateway is a `baton serve` URL (token in / token out /generate)."""
    from baton.rollout.server import build_app

    _, engine, _ = gateway
    tok = engine.tokenizer
    serve = ServerThread(build_app(engine, tok, "m"))
    gw = Gateway(HttpEngine(serve.url), tok, model_name="m")
    front = ServerThread(gw.app())
    try:
        start = len(engine.record)
        (sid,) = _run_agents(front.url, 1, "g", follow_up=False)
        t = gw.sessions[sid].trajectory()
        assert t["turns"] == 2 and t["reward"] == 1.0
        for p, c in engine.record[start:]:
            assert t["tokens"][len(p):len(p) + len(c.token_ids)] == c.token_ids
            assert t["logprobs"][len(p):len(p) + len(c.token_ids)] == pytest.approx(c.logprobs, abs=1e-6)
    finally:
        front.stop()
        serve.stop()


def test_actor_update_ignores_inserted_tokens(gateway, tmp_path):
    """One GRPO-style actor update on gateway rows: whatever stands at the mask-0 (template)
    positions - advantages, old and behaviour logprobs - the updated weights are the same,
    so those tokens get no gradient; the mask-1 tokens do move the weights."""
    from baton.algos.config import AlgoConfig
    from baton.controller import ResourcePool, WorkerGroup
    from baton.models.config import ModelConfig
    from baton.models.make import make_tiny_checkpoint
    from baton.workers.actor import ActorConfig, ActorWorker

    gw, _, url = gateway
    _run_agents(url, 2, "upd", follow_up=False)
    rows = GatewayRows(gw, group_size=2, wait_s=10).rows(1)
    mask = rows[F.RESPONSE_MASK]  # [B, R]
    B, R = mask.shape
    holes = (mask == 0) & (rows[F.RESPONSE_IDS] != gw.tok.pad_token_id)  # inserted tokens inside the response
    assert holes.any() and (mask == 1).any()
    model_dir = str(make_tiny_checkpoint(tmp_path / "tiny", preset="0.75m", seed=3, max_position=1024))

    def update(poison: bool) -> torch.Tensor:
        batch = rows.rows(list(range(B)))  # a copy
        actor = WorkerGroup(ResourcePool(1), ActorWorker, ModelConfig(path=model_dir),
                            ActorConfig(lr=1e-2, micro_batch_size=B, grad_clip=1e9), AlgoConfig(),
                            temperature=1.0, max_new_tokens=R, total_steps=1, seed=0)
        try:
            old = actor.compute_logprobs(batch).get()[F.OLD_LOGPROBS]  # [B, R]
            adv = torch.tensor([1.0, -1.0])[:, None].expand(B, R).clone() * mask  # [B, R]
            batch[F.OLD_LOGPROBS], batch[F.ADVANTAGES] = old, adv
            batch[F.ROLLOUT_LOGPROBS] = old.clone()
            if poison:  # garbage where the template inserted tokens
                for name, value in ((F.ADVANTAGES, 1e3), (F.OLD_LOGPROBS, -30.0), (F.ROLLOUT_LOGPROBS, -30.0)):
                    batch[name] = torch.where(holes, torch.full_like(batch[name], value), batch[name])
            actor.update(batch)
            after = actor.compute_logprobs(batch).get()[F.OLD_LOGPROBS]  # [B, R]
        finally:
            actor.shutdown()
        return old, after

    old, clean = update(False)
    _, poisoned = update(True)
    assert (clean - old)[mask.bool()].abs().max() > 1e-4  # the update did something
    torch.testing.assert_close(poisoned, clean, rtol=0, atol=1e-6)


def test_dropped_sessions_leave_their_group(gateway):
    """An aborted session and one idle past its deadline never become rows; their group
    completes with the sessions that finished, which share a group_index."""
    gw, _, url = gateway
    client = httpx.Client(base_url=url, timeout=60)
    body = {"messages": [{"role": "user", "content": "hi thanks"}], "max_tokens": 3}
    sids = [client.post("/sessions", json={"group": g}).json()["session_id"] for g in ("a", "a", "a", "b", "b", "b")]
    for sid in sids:
        assert client.post(f"/sessions/{sid}/v1/chat/completions", json=body).status_code == 200
    for sid in (sids[0], sids[3], sids[4], sids[5]):
        assert client.post(f"/sessions/{sid}/reward", json={"reward": 1.0}).status_code == 200
    assert client.post(f"/sessions/{sids[1]}/abort", json={"reason": "tool"}).json()["dropped"] is True
    assert client.post(f"/sessions/{sids[1]}/v1/chat/completions", json=body).status_code == 404
    assert client.post(f"/sessions/{sids[0]}/abort", json={}).status_code == 409  # finished
    gw.sessions[sids[2]].active -= 100  # idle for 100 s (no timer raced: the clock is set back)
    source = GatewayRows(gw, group_size=3, groups_per_step=2, wait_s=5, session_idle_s=50)
    rows = source.rows(1)
    assert gw.dropped == {"tool": 1, "deadline": 1} and not gw.sessions
    assert len(rows) == 4 and rows[F.GROUP_INDEX].tolist() in ([0, 1, 1, 1], [0, 0, 0, 1])
    assert source.state_dict()["dropped"] == {"tool": 1, "deadline": 1}
    gw.dropped.clear()


def test_api_key_and_cli_errors(gateway, tmp_path, capsys):
    from baton.services.gateway import gateway_main

    gw, _, _ = gateway
    thread = ServerThread(gw.app(api_key="sekrit"))
    try:
        assert httpx.get(f"{thread.url}/health", timeout=60).status_code == 200
        assert httpx.post(f"{thread.url}/sessions", json={}, timeout=60).status_code == 401
        sid = httpx.post(f"{thread.url}/sessions", json={},
                         headers={"Authorization": "Bearer sekrit"}, timeout=60).json()["session_id"]
        client = openai.OpenAI(base_url=f"{thread.url}/sessions/{sid}/v1", api_key="sekrit", max_retries=0)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi thanks"}], max_tokens=2)
        assert r.usage.completion_tokens == 2
        gw.abort(sid)
    finally:
        thread.stop()
        gw.dropped.clear()
    with pytest.raises(SystemExit) as exc:
        gateway_main(["--server", "http://127.0.0.1:9", "--tokenizer", str(tmp_path / "missing")])
    assert exc.value.code == 2 and "cannot load a tokenizer" in capsys.readouterr().err


def test_gateway_main_process(tmp_path):
    """`python -m baton.services.gateway` in front of a `baton serve` (in this process)."""
    import os
    import signal
    import subprocess
    import sys

    from baton.models.load import load_model, load_tokenizer
    from baton.models.make import make_tiny_checkpoint
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.rollout.server import build_app

    model_dir = str(make_tiny_checkpoint(tmp_path / "tiny", preset="0.75m", seed=1))
    tok = load_tokenizer(model_dir)
    serve = ServerThread(build_app(EmbeddedEngine(load_model(model_dir), tok), tok, "m"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "baton.services.gateway", "--server", serve.url, "--tokenizer",
                             model_dir, "--port", "0"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("baton gateway: http://"), line
        url = line.split()[2].split("/sessions")[0]
        sid = httpx.post(f"{url}/sessions", json={}, timeout=60).json()["session_id"]
        client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="baton", messages=[{"role": "user", "content": "1+1="}], max_tokens=3,
                                           temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3
        t = httpx.get(f"{url}/sessions/{sid}", timeout=60).json()
        assert t["tokens"][:t["prompt_len"]] == list(tok("1+1=", add_special_tokens=False)["input_ids"])
        assert sum(t["mask"]) == 3
        # issue 29: a 100 MB body is refused while it streams, and SIGTERM ends the process in
        # seconds (was: no answer in 122 s, SIGTERM ignored for 21 s while it read and tokenized)
        assert post_huge(f"{url}/sessions/{sid}/v1/chat/completions", declared=False).status_code == 413
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) in (0, -signal.SIGTERM)  # uvicorn shuts down, then re-raises the signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        serve.stop()


def test_rewritten_turn_keeps_sampled_tokens(gateway):
    """The template re-writes the tool-call turn ("calling " -> "calling\\n"): the trajectory
    keeps the sampled ids, the boundary is what follows the sampled end-of-turn, and the
    mismatch is counted."""
    gw, engine, url = gateway
    engine.script = lambda p: "The answer is 42." if "<tool_response>" in p else "calling " + CALL
    try:
        (sid,) = _run_agents(url, 1, "rw", follow_up=False)
    finally:
        engine.script = _script
    t = gw.sessions[sid].trajectory()
    assert t["boundary_mismatches"] == 1 and t["reward"] == 1.0
    text = gw.tok.decode(t["tokens"], skip_special_tokens=False)
    assert ("assistant\ncalling " + CALL + "<eos>\n<|im_start|>user\n<tool_response>42</tool_response>") in text
    gw.take(1, timeout_s=1)
