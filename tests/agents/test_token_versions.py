"""Each sampled token's weight version travels in the row (issue 49): the weights change
between the turns of an agent episode and of a gateway session (a trainer step lands while
the episode runs), and the rows say which version sampled each token, their behaviour
logprobs are that version's, the rows spanning versions are counted
(`rollout/rows_spanning_versions`), and the off-policy correction weighs each token by its
own sampler. Real EmbeddedEngine over a tiny random model; the weight update is the
engine's own `update_weights` with perturbed weights."""

from __future__ import annotations

import copy

import httpx
import torch

from baton import fields as F
from baton.agents.config import AgentConfig
from baton.agents.rollout import run_episodes
from baton.algos.off_policy import tis_weights
from baton.batch import collate
from baton.protocol import SamplingParams
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.server import ServerThread
from baton.rows import Trajectory, spanning_versions, to_batch
from baton.services.gateway import Gateway
from baton.services.gateway_engines import InProcessEngine
from baton.services.gateway_rows import GatewayRows
from baton.trainers.report.step_metrics import step_metrics

from tests.services.gateway_fixtures import tiny_model, tools_tokenizer

FP32_TOL = 1e-4  # engine vs HF forward at the same fp32 weights (the sync check's bound)


class Stepping:
    """A trainer step between engine calls: after every `generate`, the engine's weights are
    moved (each parameter + 0.02 * a fixed random tensor) and it serves version + 1.
    `snapshots[v]`: a copy of the model at version v, to recompute what v would give."""

    def __init__(self, engine: EmbeddedEngine):
        self.engine = engine
        self.snapshots = {engine.version: copy.deepcopy(engine.model)}
        self._generate = engine.generate
        engine.generate = self.generate

    def step(self) -> None:
        g = torch.Generator().manual_seed(len(self.snapshots))
        with torch.no_grad():
            moved = [(n, p + 0.02 * torch.randn(p.shape, generator=g)) for n, p in self.engine.model.named_parameters()]
        self.engine.update_weights(moved, self.engine.version + 1)
        self.snapshots[self.engine.version] = copy.deepcopy(self.engine.model)

    def generate(self, prompts, params):
        out = self._generate(prompts, params)
        self.step()
        return out


def _logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log_softmax of each response token under `model` (temperature 1), teacher-forced [R]."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()  # [R, V]
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def _check_rows(rows, snapshots) -> None:
    """Every sampled token's behaviour logprob is its labelled version's, and not the other
    versions' (the label is right); mask-0 tokens are labelled -1."""
    mask, versions = rows[F.RESPONSE_MASK], rows[F.TOKEN_VERSIONS]
    assert ((versions == -1) == (mask == 0)).all()
    for i in range(len(rows)):
        prompt = rows[F.PROMPT_IDS][i][rows[F.PROMPT_MASK][i].bool()].tolist()
        R = int(mask[i].nonzero().max()) + 1
        response = rows[F.RESPONSE_IDS][i][:R].tolist()
        for v in versions[i][mask[i].bool()].unique().tolist():
            at = (versions[i][:R] == v) & mask[i][:R].bool()  # [R]
            mine = _logprobs(snapshots[v], prompt, response)[at]
            torch.testing.assert_close(rows[F.ROLLOUT_LOGPROBS][i][:R][at], mine, atol=FP32_TOL, rtol=0)
            other = _logprobs(snapshots[v + 1 if v + 1 in snapshots else v - 1], prompt, response)[at]
            assert (rows[F.ROLLOUT_LOGPROBS][i][:R][at] - other).abs().max() > 10 * FP32_TOL


def test_agent_turns_across_weight_updates():
    tok = tools_tokenizer()
    stepping = Stepping(EmbeddedEngine(tiny_model(0), tok))
    prompts = collate([{"prompt": "guess 1-20:", "answer": "13"}] * 2)
    cfg = AgentConfig(env="guess", max_turns=3, max_tokens=200, turn_max_new_tokens=4)
    rows, stats = run_episodes(stepping.engine, tok, prompts, 2, cfg, SamplingParams(seed=0))
    assert len(rows) == 4 and stats["dropped"] == {}
    turns = rows[F.NUM_TURNS].tolist()
    assert turns == [3] * 4  # a random model never guesses 13 in 4 characters
    # turn k of every episode was sampled by version k (one engine call per turn, then a step)
    v, t = rows[F.TOKEN_VERSIONS], rows[F.TURN_INDEX]
    assert torch.equal(v, t)
    assert rows[F.POLICY_VERSION].tolist() == [0] * 4  # the row's oldest
    _check_rows(rows, stepping.snapshots)
    assert spanning_versions(rows) == 4
    assert step_metrics(rows, [{}], version=3)["rollout/rows_spanning_versions"] == 4
    # the off-policy correction: each token against its own sampler (pi_prox: the newest weights)
    mask = rows[F.RESPONSE_MASK]
    prox = torch.zeros_like(rows[F.ROLLOUT_LOGPROBS])
    for i in range(len(rows)):
        prompt = rows[F.PROMPT_IDS][i][rows[F.PROMPT_MASK][i].bool()].tolist()
        R = int(mask[i].nonzero().max()) + 1
        prox[i, :R] = _logprobs(stepping.snapshots[3], prompt, rows[F.RESPONSE_IDS][i][:R].tolist())
    weights, _ = tis_weights(prox, rows[F.ROLLOUT_LOGPROBS], mask, cap=1e9)
    expect = torch.ones_like(prox)
    for i in range(len(rows)):
        prompt = rows[F.PROMPT_IDS][i][rows[F.PROMPT_MASK][i].bool()].tolist()
        R = int(mask[i].nonzero().max()) + 1
        for k in range(3):  # mu of turn k: version k's logprobs
            at = (v[i, :R] == k)
            mu = _logprobs(stepping.snapshots[k], prompt, rows[F.RESPONSE_IDS][i][:R].tolist())
            expect[i, :R][at] = (prox[i, :R][at] - mu[at]).exp()
    torch.testing.assert_close(weights, expect, atol=1e-3, rtol=1e-3)


def test_gateway_session_across_a_weight_update():
    tok = tools_tokenizer()
    stepping = Stepping(EmbeddedEngine(tiny_model(1), tok))
    stepping.engine.generate = stepping._generate  # steps by hand, between the agent's turns
    gw = Gateway(InProcessEngine(stepping.engine), tok, model_name="m", temperature=1.0)
    thread = ServerThread(gw.app())
    try:
        client = httpx.Client(base_url=thread.url, timeout=60)
        for k in range(2):  # session 0 runs both turns on version 0; session 1 straddles the update
            sid = client.post("/sessions", json={"group": "g"}).json()["session_id"]
            messages = [{"role": "user", "content": "hi"}]
            for turn in range(2):
                r = client.post(f"/sessions/{sid}/v1/chat/completions",
                                json={"messages": messages, "max_tokens": 5, "seed": turn})
                r.raise_for_status()
                messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
                if k == 1 and turn == 0:
                    stepping.step()
            client.post(f"/sessions/{sid}/reward", json={"reward": 1.0}).raise_for_status()
        rows = GatewayRows(gw, group_size=2, wait_s=10).rows(1)
    finally:
        thread.stop()
    versions = [set(r[m.bool()].tolist()) for r, m in zip(rows[F.TOKEN_VERSIONS], rows[F.RESPONSE_MASK])]
    assert sorted(map(sorted, versions)) == [[0], [0, 1]]
    assert spanning_versions(rows) == 1
    assert rows[F.POLICY_VERSION].tolist() == [0, 0]
    _check_rows(rows, stepping.snapshots)


def test_rows_without_token_versions():
    """Rows of one version each carry no column (nothing spans); mixed with rows that say
    theirs, the others' sampled tokens are their `version`'s; a length mismatch is an error."""
    tok = tools_tokenizer()
    plain = [Trajectory([1, 2], [3, 4], version=2, loss_mask=[1, 0]), Trajectory([1], [5], version=3)]
    rows = to_batch(plain, 0, tok)
    assert F.TOKEN_VERSIONS not in rows.tensors and spanning_versions(rows) == 0
    rows = to_batch([*plain, Trajectory([1], [6, 7, 8], version=1, token_versions=[1, -1, 2])], 0, tok)
    assert rows[F.TOKEN_VERSIONS].tolist() == [[2, -1, -1], [3, -1, -1], [1, -1, 2]]
    assert spanning_versions(rows) == 1
    try:
        to_batch([Trajectory([1], [6, 7], token_versions=[1])], 0, tok)
    except ValueError as e:
        assert "1 token versions for 2 response tokens" in str(e)
    else:
        raise AssertionError("a length mismatch was accepted")
