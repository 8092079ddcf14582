"""Deadlines that hold (docs/RELIABILITY.md, agents): a hung sync tool never keeps the process
alive, an env or an OpenAI-speaking agent that blocks its own event loop is abandoned at its
deadline while the others finish, `trajectory_timeout_s` is enforced however small, and what
a tool returns or prints, or a context that fills, is bounded and counted.

Each deadline here is tiny and each hang far longer (released at the end); the "within N s"
bounds only catch a hang."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from baton import fields as F
from baton.agents.config import AgentConfig
from baton.agents.envs import CalculatorEnv, calc, register_env
from baton.agents.rollout import run_episodes
from baton.agents.tokens import Conversation
from baton.agents.tools import ToolSet
from baton.batch import collate
from baton.protocol import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))  # this directory's helpers (import mode importlib)
from tests.agents.scripted_engine import ScriptedEngine  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ROW = {"prompt": "12*34=", "answer": "408"}
RELEASE = threading.Event()  # the blocked envs return once a test is done


@pytest.fixture(autouse=True)
def _release_blocked():
    RELEASE.clear()
    yield
    RELEASE.set()


HUNG_TOOL = """
import asyncio, time
from baton.agents.tools import AgentFault, ToolCall, ToolSet

def hang(expr: str) -> str:
    '''Never returns.'''
    time.sleep(3600)

async def main():
    try:
        await ToolSet.build([hang]).call(ToolCall("hang", {"expr": "1"}), 0.2)
    except AgentFault as e:
        print(e.kind)

asyncio.run(main())
"""


def test_a_hung_sync_tool_does_not_keep_the_process_alive():
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", HUNG_TOOL], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "tool_timeout", out.stderr[-2000:]
    assert time.monotonic() - t0 < 30  # imports included; before: joined at exit, an hour


@register_env("test_blocks_loop")
class BlocksItsLoop(CalculatorEnv):
    """Rows whose prompt starts with "9" block the env's event loop in `step` (no await)."""

    async def step(self, turn):
        if self.messages[0]["content"].startswith("9"):
            RELEASE.wait(120)
        return await super().step(turn)


def test_an_env_blocking_its_loop_is_abandoned_at_its_deadline_and_the_others_finish(qwen_tok):
    cfg = AgentConfig(env="test_blocks_loop", env_timeout_s=0.3, trajectory_timeout_s=60, max_tokens=400,
                      turn_max_new_tokens=80)
    t0 = time.monotonic()
    rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, collate([ROW, {"prompt": "9*9=", "answer": "81"}]),
                               2, cfg, SamplingParams())
    assert stats["dropped"] == {"env_timeout": 2} and stats["abandoned"] == 2
    assert len(rows) == 2 and rows[F.REWARDS].tolist() == [1.0, 1.0]  # the others were not held back
    assert time.monotonic() - t0 < 15


def test_a_tiny_trajectory_timeout_is_enforced(qwen_tok):
    rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, collate([ROW]), 4,
                               AgentConfig(trajectory_timeout_s=1e-6, max_tokens=400, turn_max_new_tokens=80),
                               SamplingParams())
    assert len(rows) == 0 and stats["dropped"] == {"trajectory_timeout": 4}  # before: all 4 kept


def test_a_gateway_agent_blocking_its_loop_is_dropped_at_the_session_deadline(monkeypatch):
    import faulty_agents

    from baton.agents.config import GatewayAgentConfig
    from baton.agents.gateway_run import run_sessions
    from baton.models.tiny import build_tiny_model
    from baton.models.tokenizer import build_char_tokenizer
    from baton.rollout.embedded.engine import EmbeddedEngine

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    tok = build_char_tokenizer()
    engine = EmbeddedEngine(build_tiny_model("0.75m"), tok)
    prompts = collate([{"prompt": "block 1"}, {"prompt": "1+1="}])
    t0 = time.monotonic()
    try:
        rows = run_sessions(engine, tok, prompts, 2, GatewayAgentConfig(agent="faulty_agents:blocks_or_answers",
                                                                        session_timeout_s=8.0), temperature=1.0)
    finally:
        faulty_agents.RELEASE.set()
    stats = rows.meta["agent_stats"]
    assert stats["dropped"] == {"deadline": 2} and stats["abandoned"] == 2
    assert len(rows) == 2 and rows[F.REWARDS].tolist() == [1.0, 1.0]
    assert time.monotonic() - t0 < 40  # before: the blocked loop held every session for 120 s


def _huge(expr: str) -> str:
    """Returns 10 MB."""
    return "7" * 10_000_000


def _chatty(expr: str) -> str:
    """Prints 5 MB, returns the product."""
    for _ in range(5000):
        print("x" * 1000)
    return str(eval(expr))  # noqa: S307 - test tool


@register_env("test_huge_tool")
class HugeTool(CalculatorEnv):
    TOOLS = {"calc": _huge}


@register_env("test_chatty_tool")
class ChattyTool(CalculatorEnv):
    TOOLS = {"calc": _chatty}


def test_a_10_mb_tool_result_is_cut_with_a_marker_and_counted(qwen_tok):
    t0 = time.monotonic()
    rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, collate([ROW]), 2,
                               AgentConfig(env="test_huge_tool", max_observation_chars=100, max_tokens=400,
                                           turn_max_new_tokens=80), SamplingParams())
    assert stats["cut"] == {"observation": 2} and len(rows) == 2
    hole = qwen_tok.decode(rows[F.RESPONSE_IDS][0][~rows[F.RESPONSE_MASK][0].bool()])
    assert "7" * 100 + "\n[... 9999900 characters cut]" in hole  # what the model reads
    assert time.monotonic() - t0 < 15


def test_a_tool_printing_heavily_prints_to_stdout_and_its_return_value_is_the_observation(qwen_tok, capfd):
    rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, collate([ROW]), 1,
                               AgentConfig(env="test_chatty_tool", max_tokens=400, turn_max_new_tokens=80),
                               SamplingParams())
    assert len(capfd.readouterr().out) >= 5_000_000  # not captured, not read by the model
    hole = qwen_tok.decode(rows[F.RESPONSE_IDS][0][~rows[F.RESPONSE_MASK][0].bool()])
    assert "<tool_response>\n408\n</tool_response>" in hole and "x" not in hole
    assert rows[F.REWARDS].tolist() == [1.0] and "cut" not in stats


class SmallContext(ScriptedEngine):
    """A model whose context holds the prompt and 100 tokens (the first turn and its call, not
    the tool's answer and a second turn); records every request's prompt + max_new."""

    def __init__(self, tok):
        super().__init__(tok)
        self.asked, self.max_model_len = [], len(Conversation(tok, [{"role": "user", "content": ROW["prompt"]}],
                                                            ToolSet.build([calc]).schemas()).prompt_ids) + 100

    def generate(self, prompts, params):
        self.asked += [len(p) + params.max_new_tokens for p in prompts]
        return super().generate(prompts, params)


def test_an_episode_outgrowing_the_context_ends_there_counted(qwen_tok):
    eng = SmallContext(qwen_tok)
    rows, stats = run_episodes(eng, qwen_tok, collate([ROW]), 2,
                               AgentConfig(max_tokens=400, turn_max_new_tokens=80), SamplingParams())
    assert len(eng.asked) == 2 and max(eng.asked) <= eng.max_model_len  # never past the context (before: 2 turns more)
    assert stats["cut"] == {"context": 2} and rows[F.FINISH_REASON].tolist() == ["length", "length"]
    rows, stats = run_episodes(SmallContext(qwen_tok), qwen_tok, collate([ROW]), 2,
                               AgentConfig(max_tokens=400, turn_max_new_tokens=80, truncation="drop"),
                               SamplingParams())
    assert stats["dropped"] == {"context": 2} and len(rows) == 0


def test_a_job_ending_after_the_deadline_is_judged_late_by_one_clock_on_both_sides():
    """The job and the watchdog read the same deadline (`Watch.deadline`) at the same instant
    (the claim): a job that claims late sees `late` and drops its work, and the watchdog
    counts it a timeout; never kept by one side and dropped by the other (the gateway once
    kept a session's reward yet counted it dropped)."""
    import asyncio

    from baton.agents.watchdog import run_watched

    seen = {}

    def job(sleep_s: float, name: str):
        async def run(watch):
            await asyncio.sleep(sleep_s)
            if not watch.claim():
                return "taken"
            seen[name] = watch.late
            return "late" if watch.late else "kept"
        return run

    # generous margins both ways: the outcome never depends on how busy the machine is
    on_time = run_watched([job(0.0, "on_time")], 60.0, give_up=lambda i, kind: kind, grace_s=60.0)
    late = run_watched([job(0.01, "late")], 0.0, give_up=lambda i, kind: kind, grace_s=60.0)
    assert on_time == (["kept"], 0) and late == (["trajectory_timeout"], 0)
    assert seen == {"on_time": False, "late": True}


def test_a_job_the_watchdog_gives_up_on_is_logged_like_every_other_drop(monkeypatch, caplog):
    """The step's error says the first fault of each kind is in the log: a job abandoned by
    the watchdog (it blocked its loop past the deadline) is one of them."""
    import logging

    from baton.agents import tools
    from baton.agents.watchdog import run_watched

    monkeypatch.setattr(tools, "_NOTED", set())  # first-of-kind is per process

    async def blocks(watch):
        time.sleep(1.0)  # blocks its own loop: only the watchdog can end it

    with caplog.at_level(logging.WARNING):
        results, _ = run_watched([blocks], 0.0, give_up=lambda i, kind: kind, grace_s=0.05)
    assert results == ["trajectory_timeout"]
    assert "agent fault trajectory_timeout" in caplog.text


@register_env("test_slow_import")
class SlowImport(CalculatorEnv):
    """An env whose `start` imports a slow package (openenv: 4.5 s of CPU) the first time,
    as `OpenEnvEpisode.start` did: `prepare()` is that import, a no-op once done."""
    imported = 0

    @classmethod
    def prepare(cls):
        if not cls.imported:
            time.sleep(3.0)  # the import: 10x the env deadline below
            cls.imported += 1

    async def start(self):
        self.prepare()  # a lazy import inside start: free once prepare ran
        return await super().start()


def test_an_envs_slow_import_runs_once_before_the_deadlines(qwen_tok):
    """Issue 50.6: the import runs once, before any trajectory's env_timeout_s (before: inside
    it, every trajectory "timed out", their threads queued on the import lock)."""
    cfg = AgentConfig(env="test_slow_import", env_timeout_s=0.3, trajectory_timeout_s=60, max_tokens=400,
                      turn_max_new_tokens=80)
    rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, collate([ROW]), 4, cfg, SamplingParams())
    assert not stats.get("dropped") and len(rows) == 4 and SlowImport.imported == 1


def test_openenv_imports_openenv_in_prepare(monkeypatch):
    """The OpenEnv env's import is its `prepare` (what `prepare_env` runs before the
    trajectories); its own tests need the openenv extra (tests/envs/test_openenv.py)."""
    from baton.agents.envs.openenv import OpenEnvEpisode

    monkeypatch.setitem(sys.modules, "openenv", None)  # as if not installed: prepare() is what imports it
    with pytest.raises(ImportError):
        OpenEnvEpisode.prepare()
