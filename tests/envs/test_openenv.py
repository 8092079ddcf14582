"""`agent.env: openenv` (baton/agents/envs/openenv.py) against real OpenEnv servers: openenv-core's
own server (create_app, uvicorn) on loopback, serving pure-Python environments: the recipe's
guess environment (recipes/envs/openenv_guess.py: a typed action per turn) and an MCP
environment written here (tools listed by the server, called per tool call, a submit tool that
ends the episode). The recipe runs 2 steps (marker `envs_extra`). Without the extra:
tests/envs/test_missing_extras.py."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv.core")
from fastmcp import FastMCP  # noqa: E402 - openenv-core's dependency
from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation  # noqa: E402
from openenv.core.env_server.types import Observation, State  # noqa: E402

from baton.agents.episode import AssistantTurn  # noqa: E402
from baton.agents.envs.openenv import OpenEnvEpisode  # noqa: E402
from baton.agents.tools import NONE, OK, AgentFault, parse_tool_calls  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes/envs/grpo_openenv.yaml"


class ProductObservation(Observation):
    text: str = ""


class ProductEnvironment(MCPEnvironment):
    """An MCP environment: reset shows "A*B="; tools `calc(expr)` and `submit(answer)`; a
    submitted answer ends the episode, reward 1 if it is the product."""
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("product")
        self.a = self.b = 0
        self.submitted: str | None = None

        @mcp.tool()
        def calc(expr: str) -> str:
            """Evaluate a product of two integers, e.g. 12*34."""
            a, b = expr.split("*")  # "2+": ValueError, the tool's fault (execution_error)
            return str(int(a) * int(b))

        @mcp.tool()
        def submit(answer: str) -> str:
            """Submit the final answer."""
            self.submitted = answer
            return "submitted"

        super().__init__(mcp)
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> ProductObservation:
        rng = random.Random(seed)
        self.a, self.b, self.submitted = rng.randint(10, 99), rng.randint(10, 99), None
        return ProductObservation(text=f"{self.a}*{self.b}=")

    async def step_async(self, action, timeout_s=None, **kw):
        obs = await super().step_async(action, timeout_s=timeout_s, **kw)
        if self.submitted is not None:
            obs.done, obs.reward = True, float(self.submitted.strip() == str(self.a * self.b))
        return obs

    def _step_impl(self, action, timeout_s=None, **kw):
        raise AssertionError("every action of this env is a tool call")

    @property
    def state(self) -> State:
        return self._state


def serve(app: Any):
    """openenv-core's FastAPI app under uvicorn on a loopback port, in a daemon thread."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the OpenEnv server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def guess_url():
    from recipes.envs.openenv_guess import make_app

    yield from serve(make_app())


@pytest.fixture(scope="module")
def product_url():
    yield from serve(create_app(ProductEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=8))


@pytest.fixture(autouse=True, scope="module")
def _repo_importable():
    import sys

    sys.path.insert(0, str(REPO))
    yield
    sys.path.remove(str(REPO))


def turn(text: str, tools: frozenset[str] = frozenset()) -> AssistantTurn:
    calls, status, err = parse_tool_calls(text, tools)
    return AssistantTurn(text, calls, status, err)


def play(ep: OpenEnvEpisode, texts: list[str]) -> tuple[Any, list[Any]]:
    async def go():
        start = await ep.start()
        try:
            return start, [await ep.step(turn(t, ep.tools.names if ep.tools else frozenset())) for t in texts]
        finally:
            await ep.close()
    return asyncio.run(go())


def test_guess_episode_reset_step_rewards(guess_url):
    from recipes.envs.openenv_guess import GuessEnvironment

    row = {"prompt": "3..9=", "answer": "5"}
    ref = GuessEnvironment()
    first = ref.reset(seed=__import__("zlib").crc32(b"3..9=")).text  # the seed: crc32 of the prompt
    lo, secret = ref.lo, ref.secret
    env_args = {"url": guess_url, "action_field": "guess", "observation_field": "text"}
    below = secret - 1 if secret > lo else None
    guesses = ([str(below)] if below is not None else []) + ["x", str(secret)]
    start, obs = play(OpenEnvEpisode(row, **env_args), guesses)
    assert start.messages == [{"role": "user", "content": first}] and start.tools is None
    if below is not None:  # a guess inside the range, below the secret: "higher=", per-turn 0.1
        assert obs[0].messages == [{"role": "user", "content": "higher="}] and obs[0].reward == 0.1
    assert obs[-2].messages[0]["content"] == "a number=" and obs[-2].reward == 0.0 and not obs[-2].done
    assert obs[-1].done and obs[-1].final_reward == 1.0  # found: the last step's reward is the trajectory's
    # without observation_field, an observation is its fields as JSON
    start, _ = play(OpenEnvEpisode(row, url=guess_url, action_field="guess"), [])
    assert start.messages[0]["content"] == '{"text": "%s"}' % first


def test_mcp_tools_listed_called_and_submitted(product_url):
    ep = OpenEnvEpisode({"prompt": "p", "seed": 7}, url=product_url)
    rng = random.Random(7)
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    call = '<tool_call>{"name": "%s", "arguments": {"%s": "%s"}}</tool_call>'
    start, obs = play(ep, [call % ("calc", "expr", f"{a}*{b}"), call % ("calc", "x", "2"),
                           call % ("submit", "answer", str(a * b))])
    assert start.messages == [{"role": "user", "content": f'{{"text": "{a}*{b}="}}'}]
    assert sorted(t["function"]["name"] for t in start.tools) == ["calc", "submit"]
    assert start.tools[0]["function"]["parameters"]["properties"] == {"expr": {"type": "string"}}
    assert obs[0].messages == [{"role": "tool", "content": str(a * b)}] and not obs[0].done
    assert obs[1].messages[0]["content"].startswith("error: ")  # the model's bad arguments (invalid_args), shown
    assert obs[2].done and obs[2].final_reward == 1.0
    # a wrong answer scores 0; a turn without a tool call ends the episode unscored
    _, obs = play(OpenEnvEpisode({"seed": 7}, url=product_url), [call % ("submit", "answer", "1")])
    assert obs[0].done and obs[0].final_reward == 0.0
    _, obs = play(OpenEnvEpisode({"seed": 7}, url=product_url), ["I give up"])
    assert obs[0].done and obs[0].final_reward == 0.0 and turn("I give up").status == NONE != OK


def test_server_refusal_and_tool_failure_are_faults(guess_url, product_url):
    with pytest.raises(AgentFault, match="env_error"):  # the server's schema refuses the action
        play(OpenEnvEpisode({"prompt": "p"}, url=guess_url, action_field="bogus"), ["1"])
    with pytest.raises(AgentFault, match="tool_error: calc: execution_error"):  # the tool raised
        play(OpenEnvEpisode({"seed": 1}, url=product_url), ['<tool_call>{"name": "calc", "arguments": {"expr": "2+"}}</tool_call>'])


@pytest.mark.parametrize("env_args,match", [
    ({}, "needs the server's http"),
    ({"url": "127.0.0.1:8011"}, "needs the server's http"),
    ({"url": "http://127.0.0.1:8011", "bogus": 1}, r"\['bogus'\] are not arguments"),
    ({"url": "http://127.0.0.1:8011", "action_field": 3}, "action_field must be a string"),
])
def test_bad_env_args_refused(env_args, match):
    from baton.config import ConfigError, load_config
    from baton.trainers.ppo_config import PPOConfig

    with pytest.raises(ConfigError, match=match):
        load_config(PPOConfig, RECIPE, [f"agent.env_args={env_args}"])


@pytest.mark.envs_extra
def test_recipe_runs_two_steps(guess_url, tmp_path, monkeypatch):
    from baton.cli import main
    from baton.metrics import read_metrics

    monkeypatch.chdir(REPO)
    assert main(["train", str(RECIPE), "trainer.steps=2", f"trainer.run_dir={tmp_path}", "data.prompts_per_step=4",
                 "rollout.n=4", "data.eval_size=4", f"agent.env_args.url={guess_url}",
                 "actor.mini_batch_size=0", "actor.micro_batch_size=32", "trainer.progress=false"]) == 0
    steps = [r for r in read_metrics(tmp_path) if "actor/loss" in r]
    assert len(steps) == 2 and all(0 <= s["reward/mean"] <= 1.5 for s in steps)


def test_the_documented_server_says_where_it_listens_and_ends_sessions_quietly(tmp_path):
    """`python -m recipes.envs.openenv_guess --port P` as docs/ENVIRONMENTS.md runs it: one line
    saying where it listens, and nothing on its stderr for sessions its clients open and close
    (openenv-core 0.3.0 logged a WebSocketDisconnect traceback per session: 5,004 in a run)."""
    import os
    import subprocess
    import sys

    from openenv import GenericEnvClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = open(tmp_path / "stderr", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "recipes.envs.openenv_guess", "--port", str(port)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        import select

        assert select.select([proc.stdout], [], [], 60)[0], "the server printed no line in 60 s"
        line = proc.stdout.readline()
        assert line == f"openenv guess env: listening on http://127.0.0.1:{port} (sessions: ws://127.0.0.1:{port}/ws)\n"

        async def sessions() -> list[str]:
            seen = []
            for seed in range(5):
                client = GenericEnvClient(base_url=f"http://127.0.0.1:{port}")
                seen.append((await client.reset(seed=seed)).observation["text"])
                await client.step({"guess": "5"})
                await client.close()
            return seen

        assert all(t.endswith("=") for t in asyncio.run(sessions()))
        time.sleep(0.5)  # the server's side of the last close
    finally:
        proc.terminate()
        proc.wait(10)
    err.seek(0)
    assert "Traceback" not in err.read()
