"""A verifiers environment's own multi-turn, tool-calling episodes through baton's gateway
(`gateway.agent: baton.envs.verifiers_env:episode`). The environment is written here as a user
would: a task "A*7?" with an MCP toolset (`multiply`, served by verifiers on its subprocess
runtime), an `Env` that asks a second question after the first answer ("plus 1?"), and an
`@vf.reward` on the last reply. The engine's text is scripted (a tiny random model never writes a
tool call; tests/services/gateway_fixtures.py), its logprobs the real model's. The rows must hold
the gateway's token invariant: mask 1 exactly on the engine's sampled tokens, their stored
logprobs the engine's (and the model's, recomputed over the whole row), the env's and the tool's
turns mask 0; the reward is the rubric's. A hung env is dropped at the session deadline and a
failing one counted, never scored 0. The recipe's 2-step run: marker `envs_extra`."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1")
pytest.importorskip("openai")
REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.envs.test_verifiers_env"  # the taskset id: this module (its __all__)
CALC_URL = "BATON_TEST_CALC_URL"  # set: the toolset is one running server; unset: verifiers starts one per rollout
RECIPE = REPO / "recipes/envs/grpo_verifiers_multiturn.yaml"


class TimesData(vf.TaskData):
    a: int = 0
    mode: str = "play"  # play | hang | fail: what the env does


class CalcConfig(vf.ToolsetConfig):
    pass


class Calc(vf.Toolset[CalcConfig, vf.State]):
    @vf.tool
    async def multiply(self, a: int, b: int) -> str:
        """a times b"""
        return str(a * b)


class TimesTask(vf.Task[TimesData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Calc(CalcConfig(url=os.environ.get(CALC_URL)))]

    @vf.reward(weight=1.0)
    async def right(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == str(self.data.a * 7 + 1))


class TimesTasksetConfig(vf.TasksetConfig):
    n: int = 20
    mode: str = "play"


class Times(vf.Taskset[TimesTask, TimesTasksetConfig]):
    def load(self):
        for a in range(self.config.n):
            yield TimesTask(TimesData(prompt=f"{a}*7?", a=a, mode=self.config.mode), self.config.task)


class TimesEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class TimesEnv(vf.Env[TimesEnvConfig]):
    async def run(self, task, agents):
        if task.data.mode == "hang":  # an env server that never answers
            await asyncio.sleep(3600)
        if task.data.mode == "fail":
            raise ConnectionError("the env's server went away")
        async with agents.player.interaction(task) as talk:
            segment = await talk.turn()  # a tool call, its result, an answer: one segment
            if not segment.terminated:
                await talk.turn("plus 1?")


__all__ = ["Times", "TimesEnv"]
if __name__ == "__main__":  # verifiers runs a toolset as `python -m <its module>`
    Calc.run()


def script(prompt: str) -> str:
    """The policy's text: call the tool, report its result, then add 1 (wrong for odd A)."""
    a = int(re.findall(r"(\d+)\*7\?", prompt)[-1])
    if "plus 1?" in prompt:
        return str(a * 7 + (1 if a % 2 == 0 else 0))
    if "<tool_response>" in prompt:
        return "it is " + re.findall(r"<tool_response>(\d+)</tool_response>", prompt)[-1]
    return '<tool_call>{"name": "calc_multiply", "arguments": {"a": %d, "b": 7}}</tool_call>' % a


@pytest.fixture(autouse=True)
def _repo_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the tool server's process imports this module
    monkeypatch.chdir(REPO)


@pytest.fixture(scope="module")
def calc_server():
    """The toolset served once (verifiers' own server, `python -m` this module) for the module's
    tests: a tool server per rollout is a Python process per episode (test_tool_server_per_rollout)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "VF_CONFIG": "{}", "MCP_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", MODULE], cwd=REPO, env=env)
    try:
        for _ in range(600):  # its imports take seconds (minutes on a loaded machine)
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, "the tool server exited"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(30)


def _sessions(prompts: list[dict], n: int, timeout_s: float = 120.0, engine=None):
    from baton.agents.config import GatewayAgentConfig
    from baton.agents.gateway_run import run_sessions
    from baton.batch import collate

    from tests.services.gateway_fixtures import ScriptedEngine, tiny_model, tools_tokenizer

    tok = tools_tokenizer()
    engine = engine or ScriptedEngine(tiny_model(0), tok, script)
    cfg = GatewayAgentConfig(agent="baton.envs.verifiers_env:episode", max_tokens=80, session_timeout_s=timeout_s)
    return run_sessions(engine, tok, collate(prompts), n, cfg, temperature=1.0), engine


def _rows(mode: str = "play", k: int = 2) -> list[dict]:
    from baton.envs import configured_task

    rows = configured_task("verifiers", {"taskset": MODULE, "taskset_args": {"n": 20, "mode": mode}}).train_rows()
    return sorted(rows, key=lambda r: r["vf_index"])[:k]  # A = 0 and 1 (or the first two kept)


def test_multi_turn_tool_episodes_hold_the_gateway_token_invariant(calc_server, monkeypatch):
    import torch

    from baton import fields as F

    monkeypatch.setenv(CALC_URL, calc_server)
    rows, engine = _sessions(_rows(), n=1)
    assert rows.meta["agent_stats"] == {"trajectories": 2, "dropped": {}, "boundary_mismatches": 0}
    assert not [k for k in os.environ if k.startswith("BATON_VF_KEY_")]  # the sessions' key is gone with them
    tok = engine.tokenizer
    for i in range(len(rows)):
        prompt = rows[F.PROMPT_IDS][i][rows[F.PROMPT_MASK][i].bool()].tolist()
        mask = rows[F.RESPONSE_MASK][i]
        resp = rows[F.RESPONSE_IDS][i][:int(mask.nonzero().max()) + 1].tolist()
        lps = rows[F.ROLLOUT_LOGPROBS][i][:len(resp)]
        text = tok.decode(prompt + resp, skip_special_tokens=False)
        a = int(re.findall(r"(\d+)\*7\?", text)[0])
        # three policy turns (the call, its report, the second answer), each the engine's
        # output at the trajectory so far: mask 1 on exactly those tokens, their logprobs
        mine = [(p, c) for p, c in engine.record
                if (prompt + resp)[:len(p)] == p and (prompt + resp)[len(p):len(p) + len(c.token_ids)] == c.token_ids]
        spans = {(len(p) - len(prompt), len(c.token_ids)): c.logprobs for p, c in mine}
        assert len(spans) == 3, text
        sampled = torch.zeros(len(resp), dtype=torch.bool)
        for (start, length), clp in spans.items():
            sampled[start:start + length] = True
            assert lps[start:start + length].tolist() == pytest.approx(clp, abs=1e-6)
        assert torch.equal(mask[:len(resp)].bool(), sampled) and (lps[~sampled] == 0).all()
        # the env's and the tool's turns are mask-0 text the chat template wrote
        assert f"<tool_response>{a * 7}</tool_response>" in text and "<|im_start|>user\nplus 1?" in text
        # the stored logprobs are the model's: recomputed over the whole row
        with torch.no_grad():
            logits = engine.model(input_ids=torch.tensor([prompt + resp])).logits[0, len(prompt) - 1:-1].float()
        again = torch.log_softmax(logits, -1).gather(-1, torch.tensor(resp)[:, None])[:, 0]
        assert again[sampled].tolist() == pytest.approx(lps[sampled].tolist(), abs=1e-5)
        assert rows[F.REWARDS][i].item() == float(a % 2 == 0)  # the task's @vf.reward on the last answer


@pytest.mark.slow
def test_tool_server_per_rollout(monkeypatch):
    """verifiers starts the task's tool server for each rollout (its subprocess runtime)."""
    monkeypatch.delenv(CALC_URL, raising=False)
    rows, _ = _sessions(_rows(k=1), n=1, timeout_s=600.0)
    assert len(rows) == 1 and rows.meta["agent_stats"]["dropped"] == {}


@pytest.mark.parametrize("mode,reason", [("hang", "deadline"), ("fail", "agent_error")])
def test_a_hung_or_failing_env_is_dropped_and_counted(mode, reason):
    rows, _ = _sessions(_rows(mode, k=1), n=2, timeout_s=3.0)
    assert len(rows) == 0 and rows.meta["agent_stats"]["dropped"] == {reason: 2}


def test_an_env_with_two_seats_is_refused(monkeypatch):
    """A second seat would be a second model in the same gateway session (a judge, a user)."""
    from verifiers.v1.utils import loaders

    from baton.envs.verifiers_env import env_config

    assert env_config(MODULE, '{"n": 3}').player.harness.id == "baton_inprocess"

    class TwoSeats(vf.EnvConfig):
        player: vf.AgentConfig = vf.AgentConfig()
        judge: vf.AgentConfig = vf.AgentConfig()

    monkeypatch.setattr(loaders, "env_config_type", lambda taskset_id: TwoSeats)
    with pytest.raises(ValueError, match=r"seats \['player', 'judge'\]"):
        env_config(MODULE, '{"n": 4}')


@pytest.mark.envs_extra
def test_recipe_runs_two_steps(tmp_path):
    from .recipe_runs import two_steps

    steps = two_steps(RECIPE, tmp_path)
    assert all(s["agent/trajectories"] == 32 for s in steps)
    assert all(abs(s["actor/approx_kl"]) < 1e-3 for s in steps)  # the trainer's logprobs = the engine's
