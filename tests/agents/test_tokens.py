"""Golden tests: trajectories built from sampled ids + template deltas re-render exactly."""

from __future__ import annotations

from baton.agents.tokens import BOUNDARY, OBS, POLICY, Conversation, encode
from baton.agents.tools import function_schema


def calc(expr: str) -> str:
    """Evaluate an arithmetic expression.

    expr: digits and + - *"""
    return str(eval(expr))  # noqa: S307 - test tool


def _turn(tok, text, end=True):
    ids = encode(tok, text) + ([tok.eos_token_id] if end else [])
    return ids, [-0.5] * len(ids)


def test_qwen_chatml_with_tools_two_turns(qwen_tok):
    tools = [function_schema(calc)]
    traj = Conversation(qwen_tok, [{"role": "user", "content": "12*34?"}], tools)
    assert qwen_tok.decode(traj.prompt_ids).endswith("<|im_start|>user\n12*34?<|im_end|>\n<|im_start|>assistant\n")
    call = '<tool_call>\n{"name": "calc", "arguments": {"expr": "12*34"}}\n</tool_call>'
    ids, lp = _turn(qwen_tok, call)
    traj.add_turn(ids, lp, call)
    traj.add_observation([{"role": "tool", "content": "408"}])
    ids2, lp2 = _turn(qwen_tok, "408")
    traj.add_turn(ids2, lp2, "408")
    assert traj.check() == []
    r_ids, mask, logp = traj.response()
    kinds = [s.kind for s in traj.segments]
    assert kinds == [POLICY, BOUNDARY, OBS, POLICY, BOUNDARY]
    # boundary after <|im_end|> is the template's "\n", mask 0
    assert qwen_tok.decode(traj.segments[1].ids) == "\n"
    assert qwen_tok.decode(traj.segments[2].ids) == \
        "<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert sum(mask) == len(ids) + len(ids2)
    assert all(lp_ == 0.0 for lp_, m in zip(logp, mask) if not m)
    assert traj.turn_ends() == [len(ids) - 1, len(r_ids) - 2]


def test_truncated_turn_gets_end_of_turn_as_boundary(qwen_tok):
    traj = Conversation(qwen_tok, [{"role": "user", "content": "hi"}])
    ids, lp = _turn(qwen_tok, "hel", end=False)  # cut by length: no <|im_end|>
    traj.add_turn(ids, lp, "hel")
    assert qwen_tok.decode(traj.segments[1].ids) == "<|im_end|>\n"
    assert traj.check() == []


def test_llama3_trim_drift_is_reported_per_boundary(llama_tok):
    traj = Conversation(llama_tok, [{"role": "user", "content": "hi"}])
    ids, lp = _turn(llama_tok, "ok")
    traj.add_turn(ids, lp, "ok")
    traj.add_observation([{"role": "user", "content": "again"}])
    assert traj.check() == []
    # the model emits a trailing space; the template trims message content on re-render
    ids, lp = _turn(llama_tok, "fine ")
    traj.add_turn(ids, lp, "fine ")
    bad = traj.check()
    assert bad and bad[0].kind == POLICY and bad[0].turn == 1
