"""The trainer on the services path (`data.source: api`): batches from `baton api`, fed by
baton's own environment (sampling from a `baton serve` kept on the trainer's weights by
broadcast) and by an Atropos-shaped client (no policy version, no logprobs, gzip bodies)."""

from __future__ import annotations

import contextlib
import gzip
import json
import random
import threading
from pathlib import Path

import httpx
import pytest
import torch

from baton import fields as F
from baton.config import load_config
from baton.envs import make_environment, verify
from baton.metrics import read_metrics
from baton.models.load import load_model, load_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.remote import RemoteEngine
from baton.rollout.server import ServerThread, build_app
from baton.services.api import build_api_app
from baton.services.client import APIClient
from baton.services.env_runner import EnvRunner
from baton.services.groups import groups_to_batch
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "checkpoints/arith-sft")
torch.set_num_threads(1)


def tiny_run(run_dir, api_url, *extra):
    return load_config(PPOConfig, REPO / "recipes/grpo_arithmetic_api.yaml", [
        f"model.path={MODEL}", f"trainer.run_dir={run_dir}", f"data.api_url={api_url}", "data.envs=[]", "data.servers=[]",
        "data.prompts_per_step=4", "rollout.n=4", "data.eval_size=4", "actor.mini_batch_size=16",
        "actor.micro_batch_size=16", "trainer.steps=2", "trainer.progress=false", *extra])


@pytest.fixture
def api_url(tmp_path):
    s = ServerThread(build_api_app(str(tmp_path / "api.sqlite")))
    yield s.url
    s.stop()


@pytest.fixture
def served(tmp_path):
    tok = load_tokenizer(MODEL)
    engine = EmbeddedEngine(load_model(MODEL).eval(), tok)
    s = ServerThread(build_app(engine, tok, "arith-sft", model_path=MODEL))
    yield s.url, engine
    s.stop()


def test_groups_become_rows():
    tok = load_tokenizer(MODEL)
    eos = tok.eos_token_id
    groups = [{"tokens": [[5, 6, 20, 21, eos], [5, 6, 22, eos]], "masks": [[-100, -100, 20, 21, eos], [-100, -100, 22, eos]],
               "scores": [1.0, 0.0], "inference_logprobs": [[1, 1, -0.5, -0.25, -0.1], [1, 1, -2.0, -0.3]],
               "policy_version": 3, "env_id": 0},
              {"tokens": [[7, 30, 31], [7, 32, 33]], "masks": [[-100, 30, 31], [-100, 32, 33]], "scores": [0.5, 0.5],
               "inference_logprobs": [[1, -1, -1], [1, -1, -1]], "policy_version": 2, "finish_reasons": ["length", "stop"]}]
    b = groups_to_batch(groups, tok, tok.pad_token_id, group_size=2)
    assert len(b) == 4
    assert b[F.PROMPT_IDS][:, -2:].tolist()[:2] == [[5, 6], [5, 6]] and b[F.PROMPT_IDS][2, -1] == 7
    assert b[F.PROMPT_MASK].sum(1).tolist() == [2, 2, 1, 1]
    assert b[F.RESPONSE_MASK].tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 0]]
    assert b[F.ROLLOUT_LOGPROBS][1].tolist() == pytest.approx([-2.0, -0.3, 0.0])
    assert b[F.REWARDS].tolist() == [1.0, 0.0, 0.5, 0.5] and b[F.POLICY_VERSION].tolist() == [3, 3, 2, 2]
    assert list(b[F.FINISH_REASON]) == ["stop", "stop", "length", "stop"]
    with pytest.raises(ValueError, match="rollout.n=4"):
        groups_to_batch(groups, tok, tok.pad_token_id, group_size=4)


@contextlib.contextmanager
def env_feeding(api_url: str, server_url: str):
    """`baton env arithmetic` (its runner on a thread) sampling from `server_url` into the API."""
    env = make_environment("arithmetic", load_tokenizer(MODEL), group_size=4, max_new_tokens=4, eval_size=4)
    env.setup()
    stop = threading.Event()
    runner = EnvRunner(env, APIClient(api_url, stop=stop), [RemoteEngine(server_url)], concurrency=4, stop=stop)
    thread = threading.Thread(target=runner.run, kwargs={"grace_s": 5}, daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        stop.set()
        thread.join(30)


def test_baton_env_feeds_the_trainer_and_the_server_follows_its_weights(api_url, served, tmp_path):
    server_url, engine = served
    with env_feeding(api_url, server_url) as runner:
        train(tiny_run(tmp_path / "run", api_url, f"data.servers=[{server_url}]", "trainer.max_staleness=1",
                       "trainer.check_weight_sync=true"))  # broadcast after each step, parity checked
    steps = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["rollout/policy_age"] == 0 and 0 <= steps[1]["rollout/policy_age"] <= 1
    assert "timing/sync_s" in steps[0] and "actor/grad_norm" in steps[0]
    assert engine.version == 2  # the server serves the trainer's version
    # each push checked by content (the server's /weights_digest against what was sent): issue 49
    assert [r["sync/verified"] for r in steps] == [1.0, 1.0] and [r["sync/lag_steps"] for r in steps] == [0.0, 0.0]
    assert all(r["sync/bytes"] > 0 and r["sync/tensors"] > 0 and r["sync/seconds"] > 0 for r in steps), steps
    assert runner.counts["pushed"] >= 2 and runner.counts["refused"] == 0


class Tampering(EmbeddedEngine):
    """A server's engine that installs what arrived, then changes a byte of one tensor (a fault
    injected where the receive-time digest check, done before installing, cannot see it)."""

    def update_weights(self, weights, version):
        super().update_weights(weights, version)
        with torch.no_grad():
            self.model.model.norm.weight.view(-1).view(torch.uint8)[0] ^= 1


def test_a_server_not_holding_the_pushed_weights_makes_sync_verified_0(api_url, served, tmp_path, caplog):
    """Two servers, one whose install is faulty; data.sync_every=2: step 1 pushes nothing (the
    start-up push's check, lag 1), step 2 pushes. Each check names the faulty server."""
    server_url, _ = served
    tok = load_tokenizer(MODEL)
    bad = ServerThread(build_app(Tampering(load_model(MODEL).eval(), tok), tok, "arith-sft", model_path=MODEL))
    try:
        with env_feeding(api_url, server_url):
            train(tiny_run(tmp_path / "run", api_url, f"data.servers=[{server_url},{bad.url}]", "data.sync_every=2"))
    finally:
        bad.stop()
    steps = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert [r["sync/verified"] for r in steps] == [0.0, 0.0] and [r["sync/lag_steps"] for r in steps] == [1.0, 0.0]
    assert steps[0]["sync/bytes"] == 0 and steps[1]["sync/bytes"] > 0, steps
    warned = [r.getMessage() for r in caplog.records if "sync/verified=0" in r.getMessage()]
    assert len(warned) == 2 and all(f"server {bad.url} (version" in w and "'model.norm.weight'" in w
                                    and "\n" not in w for w in warned), warned


def atropos_group(tok, rng, row):
    """What an Atropos env posts: tokens/masks/scores only (no version, no logprobs)."""
    ids = tok(row["prompt"])["input_ids"]
    toks, masks, scores = [], [], []
    for _ in range(4):
        text = str(rng.randint(0, 40))
        resp = tok(text)["input_ids"] + [tok.eos_token_id]
        toks.append(ids + resp)
        masks.append([-100] * len(ids) + resp)
        scores.append(1.0 if verify(text, row["answer"]) else 0.0)
    return {"tokens": toks, "masks": masks, "scores": scores, "env_id": 0, "overrides": None}


@pytest.mark.slow  # the wire-level Atropos client runs by default in test_api.py; this adds the trainer
def test_atropos_shaped_env_feeds_the_trainer(api_url, tmp_path):
    from baton.envs import ArithmeticTask

    tok = load_tokenizer(MODEL)
    rows = ArithmeticTask().train_rows(64, seed=1)
    rng = random.Random(0)
    stop = threading.Event()

    def atropos_env():
        http = httpx.Client(base_url=api_url, timeout=10)
        while http.post("/register-env", json={"max_token_length": 64, "desired_name": "atropos", "weight": 1.0,
                                               "group_size": 4}).json().get("status") != "success":
            if stop.wait(0.2):
                return
        i = 0
        while not stop.is_set():
            st = http.request("GET", "/status-env", content=json.dumps({"env_id": 0})).json()
            if st["queue_size"] >= 8:
                stop.wait(0.05)
                continue
            body = json.dumps([atropos_group(tok, rng, rows[(i + k) % 64]) for k in range(2)]).encode()
            http.post("/scored_data_list", content=gzip.compress(body),
                      headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
            i += 2

    thread = threading.Thread(target=atropos_env, daemon=True)
    thread.start()
    try:
        train(tiny_run(tmp_path / "run", api_url))  # no servers to sync: the env is someone else's
    finally:
        stop.set()
        thread.join(10)
    steps = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2] and all("actor/loss" in r or "actor/pg_loss" in r for r in steps)


def test_env_over_openai_completions_keeps_logprobs_and_the_server_version(served):
    """`baton env --dialect vllm`: OpenAI /v1/completions with token-id prompts (here against
    baton's server, which names its weight version in `system_fingerprint`)."""
    server_url, engine = served
    engine.version = 5
    tok = load_tokenizer(MODEL)
    env = make_environment("arithmetic", tok, group_size=3, max_new_tokens=4)
    env.setup()
    g = env.collect(env.next_item(), RemoteEngine(server_url, dialect="vllm"))
    assert g.policy_version == 5 and len(g.tokens) == 3
    assert all(len(lp) == len(t) and all(x <= 0 for x, m in zip(lp, mk) if m != -100)
               for lp, t, mk in zip(g.inference_logprobs, g.tokens, g.masks))
