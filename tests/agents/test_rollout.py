"""Many trajectories through one engine: masks, rewards, groups, faults, no gradient off-policy.

`ScriptedEngine` stands in for a *trained* policy (a random tiny model cannot be made to
call tools on cue); it implements the engine protocol and is called exactly as the
embedded engine is. `test_embedded_engine_rows` runs the real EmbeddedEngine.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from baton import fields as F
from baton.agents.config import AgentConfig
from baton.agents.envs import CalculatorEnv, register_env
from baton.agents.rollout import run_episodes
from baton.algos import actor_loss, compute_advantages
from baton.batch import collate
from baton.protocol import SamplingParams
from tests.agents.scripted_engine import ScriptedEngine


def _prompts(rows):
    return collate(rows)


def test_calculator_rows_masks_rewards(qwen_tok):
    eng = ScriptedEngine(qwen_tok)
    cfg = AgentConfig(env="calculator", max_turns=3, max_tokens=400, turn_max_new_tokens=80)
    rows, stats = run_episodes(eng, qwen_tok, _prompts([{"prompt": "12*34=", "answer": "408"},
                                                        {"prompt": "21*3=", "answer": "63"}]),
                               3, cfg, SamplingParams(seed=1))
    assert len(rows) == 6 and stats["dropped"] == {} and stats["token_mismatch"] == {}
    assert eng.calls == [6, 6]  # all six trajectories' turns batched together, turn by turn
    assert rows[F.REWARDS].tolist() == [1.0] * 6
    assert rows[F.GROUP_INDEX].tolist() == [0, 0, 0, 1, 1, 1]
    assert rows[F.NUM_TURNS].tolist() == [2] * 6
    assert [list(s) for s in rows[F.TOOL_STATUS]] == [["ok", "none"]] * 6
    mask, lp, tr = rows[F.RESPONSE_MASK], rows[F.ROLLOUT_LOGPROBS], rows[F.TOKEN_REWARDS]
    text = qwen_tok.decode(rows[F.RESPONSE_IDS][0][~mask[0].bool()])
    assert "<tool_response>\n408\n</tool_response>" in text  # the observation: mask 0
    assert (lp[mask == 0] == 0).all() and (lp[mask == 1] == -0.25).all()
    last = int(mask[0].nonzero().max())
    assert tr[0, last] == 1.0 and tr[0].sum() == 1.0
    assert rows[F.POLICY_VERSION].tolist() == [3] * 6
    # a hole in the mask between the two turns
    m0 = mask[0].tolist()
    assert "".join(map(str, m0)).rstrip("0").count("10") == 1


def test_observation_tokens_get_no_gradient(qwen_tok):
    rows, _ = run_episodes(ScriptedEngine(qwen_tok), qwen_tok,
                           _prompts([{"prompt": "12*34=", "answer": "408"}, {"prompt": "2*3=", "answer": "7"}]),
                           2, AgentConfig(max_tokens=400, turn_max_new_tokens=80), SamplingParams())
    mask = rows[F.RESPONSE_MASK]
    adv, _ = compute_advantages("turn_grpo", token_rewards=rows[F.TOKEN_REWARDS], response_mask=mask,
                                group_index=torch.zeros(len(rows), dtype=torch.long))
    logp = (rows[F.ROLLOUT_LOGPROBS] + 0.01).requires_grad_(True)
    loss, _ = actor_loss(logprobs=logp, old_logprobs=rows[F.ROLLOUT_LOGPROBS], advantages=adv,
                         response_mask=mask)
    loss.backward()
    assert (logp.grad[mask == 0] == 0).all()
    assert (logp.grad[mask == 1] != 0).any()


def test_guess_per_turn_rewards(qwen_tok):
    rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok,
                               _prompts([{"prompt": "guess 1-20:", "answer": "4"}]), 1,
                               AgentConfig(env="guess", max_turns=2, max_tokens=200), SamplingParams())
    # the script guesses 10 twice: turn 1 consistent (0.1), "lower", turn 2 inconsistent (0.0)
    assert rows[F.FINISH_REASON].tolist() == ["length"]
    ends = [i for i, r in enumerate(rows[F.TOKEN_REWARDS][0].tolist()) if r]
    assert rows[F.TOKEN_REWARDS][0, ends[0]] == pytest.approx(0.1) and len(ends) == 1
    assert stats["turns_mean"] == 2


HANG_RELEASE = threading.Event()  # the test ends the hang, not a clock
HANGS = {"started": 0, "ended": 0}  # calls of _hang, under HANG_COUNT
HANG_COUNT = threading.Condition()


def _hang(expr: str) -> str:
    """Hangs until the test releases it."""
    with HANG_COUNT:
        HANGS["started"] += 1
    HANG_RELEASE.wait(60)
    with HANG_COUNT:
        HANGS["ended"] += 1
        HANG_COUNT.notify_all()
    return "0"


def _boom(expr: str) -> str:
    """Raises."""
    raise RuntimeError("tool crashed")


@register_env("test_hang")
class HangEnv(CalculatorEnv):
    TOOLS = {"calc": _hang}


@register_env("test_boom")
class BoomEnv(CalculatorEnv):
    TOOLS = {"calc": _boom}


@pytest.mark.parametrize("env,kind", [("test_hang", "tool_timeout"), ("test_boom", "tool_error")])
def test_faulty_tool_drops_trajectory_counted(qwen_tok, env, kind):
    cfg = AgentConfig(env=env, tool_timeout_s=0.2, max_tokens=400, turn_max_new_tokens=80)
    HANG_RELEASE.clear()
    ended = HANGS["ended"]
    try:
        rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok,
                                   _prompts([{"prompt": "12*34=", "answer": "408"}]), 2, cfg, SamplingParams())
        assert stats["dropped"] == {kind: 2} and len(rows) == 0
        assert HANGS["ended"] == ended  # returned while the hung tools still hang: never waited for them
    finally:
        HANG_RELEASE.set()
        with HANG_COUNT:  # the hung calls end here, not in the next test (which counted them as its own)
            assert HANG_COUNT.wait_for(lambda: HANGS["ended"] == HANGS["started"], timeout=60), HANGS


def test_budget_truncate_and_drop(qwen_tok):
    p = _prompts([{"prompt": "12*34=", "answer": "408"}])
    rows, _ = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, p, 1,
                           AgentConfig(max_tokens=60, turn_max_new_tokens=80), SamplingParams())
    assert rows[F.FINISH_REASON].tolist() == ["length"] and rows[F.REWARDS].tolist() == [0.0]
    assert rows[F.RESPONSE_MASK].shape[1] <= 60
    rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, p, 1,
                               AgentConfig(max_tokens=60, turn_max_new_tokens=80, truncation="drop"),
                               SamplingParams())
    assert stats["dropped"] == {"budget": 1}


def test_config_check():
    with pytest.raises(ValueError, match="unknown env"):
        AgentConfig(env="nope").check()
    with pytest.raises(ValueError, match="truncation"):
        AgentConfig(truncation="cut").check()
    with pytest.raises(ValueError, match="not tools"):
        AgentConfig(tools=["search"]).check()
    AgentConfig().check()


def test_embedded_engine_rows():
    from baton.models.tiny import build_tiny_model
    from baton.models.tokenizer import build_char_tokenizer
    from baton.rollout.embedded.engine import EmbeddedEngine

    tok = build_char_tokenizer()
    eng = EmbeddedEngine(build_tiny_model("0.75m"), tok)
    rows, stats = run_episodes(eng, tok, _prompts([{"prompt": "12*34=", "answer": "408"}] * 2), 2,
                               AgentConfig(max_turns=2, max_tokens=24, turn_max_new_tokens=8),
                               SamplingParams(seed=0))
    assert sum(stats["dropped"].values()) + len(rows) == 4
    mask = rows[F.RESPONSE_MASK]
    assert mask.shape == rows[F.ROLLOUT_LOGPROBS].shape and mask.shape[1] <= 24
    assert (rows[F.ROLLOUT_LOGPROBS][mask == 0] == 0).all()
    assert (rows[F.ROLLOUT_LOGPROBS][mask == 1] < 0).all()


class MalformedFirst(ScriptedEngine):
    """First turn: a broken call; after the error observation, a good one; then the answer."""

    def _reply(self, text: str) -> str:
        if "error:" not in text:
            return '<tool_call>{"name": "calc", "arguments": </tool_call>'
        return super()._reply(text)


def test_malformed_call_is_an_observation(qwen_tok):
    rows, stats = run_episodes(MalformedFirst(qwen_tok), qwen_tok, _prompts([{"prompt": "12*34=", "answer": "408"}]),
                               1, AgentConfig(max_tokens=500, turn_max_new_tokens=80), SamplingParams())
    assert list(rows[F.TOOL_STATUS][0]) == ["malformed", "ok", "none"]
    assert rows[F.REWARDS].tolist() == [1.0] and stats["token_mismatch"] == {}
    hole = qwen_tok.decode(rows[F.RESPONSE_IDS][0][~rows[F.RESPONSE_MASK][0].bool()])
    assert "error: tool call is not valid JSON" in hole


@register_env("test_slow_start")
class SlowStart(CalculatorEnv):
    started_ended = threading.Event()

    async def start(self):
        await asyncio.sleep(30)
        SlowStart.started_ended.set()


def test_env_deadline_drops(qwen_tok):
    rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok,
                               _prompts([{"prompt": "12*34=", "answer": "408"}]), 2,
                               AgentConfig(env="test_slow_start", env_timeout_s=0.2), SamplingParams())
    assert stats["dropped"] == {"env_timeout": 2}
    assert not SlowStart.started_ended.is_set()  # cut at the deadline, not after the 30 s start


def test_a_timed_out_eval_episode_is_in_the_eval_metrics(qwen_tok):
    """Held-out episodes past agent.env_timeout_s count 0 in eval/accuracy_greedy and are counted
    in eval/dropped/env_timeout (metrics.jsonl), not lost (a new user's trial saw neither)."""
    from baton.sources.episodes import evaluate_episodes

    class Rollout:  # the rollout role's generate_episodes (baton/workers/rollout.py), on the scripted engine
        def generate_episodes(self, prompts, step, agent_cfg, greedy):
            rows, _ = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, prompts, 1, AgentConfig(**agent_cfg),
                                   SamplingParams(temperature=0.0))
            return rows

    cfg = AgentConfig(env="test_slow_start", env_timeout_s=0.2)
    out = evaluate_episodes(Rollout(), cfg, [{"prompt": "12*34=", "answer": "408"}, {"prompt": "2*3=", "answer": "6"}])
    assert out["eval/accuracy_greedy"] == 0.0 and out["eval/dropped/env_timeout"] == 2.0


def test_budget_exactly_used_by_observation(qwen_tok):
    # find the response length after turn 1 + observation, then make that the whole budget
    p = _prompts([{"prompt": "12*34=", "answer": "408"}])
    full, _ = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, p, 1, AgentConfig(max_tokens=500, turn_max_new_tokens=80),
                           SamplingParams())
    first_end = int(full[F.TURN_INDEX][0].eq(1).nonzero().min())  # the second turn starts here
    rows, stats = run_episodes(ScriptedEngine(qwen_tok), qwen_tok, p, 1,
                               AgentConfig(max_tokens=first_end, turn_max_new_tokens=80), SamplingParams())
    assert rows[F.FINISH_REASON].tolist() == ["length"] and rows[F.NUM_TURNS].tolist() == [1]
