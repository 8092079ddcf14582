"""Environments (envs/environment.py, envs/gsm8k.py), math verification (rewards/math.py)
and data as users have it (data/records.py: GSM8K jsonl, verl parquet, chat-message prompts)."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch

from baton.data.records import load_rows, prompt_ids, render_prompt
from baton.envs import ArithmeticTask, make_environment, verify
from baton.envs.gsm8k import GSM8KTask, MathScorer
from baton.models.tiny import build_tiny_model
from baton.models.tokenizer import build_char_tokenizer
from baton.protocol import Completion, Engine
from baton.rewards.math import extract_answer, gsm8k_gold, math_correct, normalize_number
from baton.rollout.embedded.engine import EmbeddedEngine

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "recipes/data/gsm8k_sample.jsonl"
torch.set_num_threads(1)


@pytest.mark.parametrize("text,gold,ok", [
    ("so the answer is 18", "#### 18", True),
    ("#### 18.0", "18", True),
    ("It costs $18.", "18", True),
    ("The total is 1,234", "#### 1234", True),
    ("\\boxed{1234}", "1,234", True),
    ("#### 17", "18", False),
    ("no number at all", "18", False),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),  # not a plain number: math-verify decides
])
def test_math_correct_normalises_numbers(text, gold, ok):
    assert math_correct("q", text, answer=gold) == (1.0 if ok else 0.0)


def test_normalize_number():
    assert normalize_number("18") == normalize_number("18.0") == normalize_number("$18") == normalize_number("18.")
    assert normalize_number("1,234") == 1234 and normalize_number("-3") == -3 and normalize_number("x") is None
    assert extract_answer("a 1 b 2 c") == "2" and gsm8k_gold("3 * 6 = 18\n#### 18") == "18"


def test_rows_from_gsm8k_jsonl_verl_parquet_and_chat_template(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rows = load_rows(SAMPLE)
    assert len(rows) == 16 and rows[0]["answer"].endswith("#### 18") and isinstance(rows[0]["prompt"], str)
    verl = [{"data_source": "openai/gsm8k", "ability": "math", "extra_info": {"index": i, "split": "train"},
             "prompt": [{"role": "user", "content": r["prompt"]}],
             "reward_model": {"style": "rule", "ground_truth": gsm8k_gold(r["answer"])}} for i, r in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(verl), tmp_path / "train.parquet")
    prow = load_rows(tmp_path / "train.parquet")[0]
    assert prow["answer"] == "18" and prow["data_source"] == "openai/gsm8k" and prow["extra_info"]["index"] == 0
    tok = build_char_tokenizer()  # the tiny tokenizer's chat template: plain turns, EOS after the assistant
    assert render_prompt(tok, prow["prompt"]) == rows[0]["prompt"]
    assert prompt_ids(tok, prow["prompt"]) == tok(rows[0]["prompt"])["input_ids"]
    with pytest.raises(ValueError, match="no 'prompt'"):
        (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
        load_rows(tmp_path / "bad.jsonl")
    # the GSM8K task reads either file: train rows never include its held-out rows
    task = GSM8KTask(path=str(tmp_path / "train.parquet"), heldout_every=4)
    train, held = task.train_rows(), task.eval_rows()
    assert train and held and len(train) + len(held) == 16
    assert not {str(r["prompt"]) for r in train} & {str(r["prompt"]) for r in held}
    assert task.is_correct("... #### 18", {"answer": "18"})


def test_arithmetic_environment_collects_a_scored_group():
    tok = build_char_tokenizer()
    model = build_tiny_model(None, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, seed=0).eval()
    engine = EmbeddedEngine(model, tok)
    engine.version = 7
    env = make_environment("arithmetic", tok, group_size=4, seed=0, eval_size=8)
    env.setup()
    item = env.next_item()
    assert item == ArithmeticTask().train_rows(seed=0)[int(env.sampler._order[0])]  # the embedded path's rows
    g = env.collect(item, engine)
    ids = tok(item["prompt"])["input_ids"]
    assert len(g.tokens) == 4 and g.policy_version == 7
    for t, m, lp, text, s in zip(g.tokens, g.masks, g.inference_logprobs, g.completions, g.scores):
        assert t[:len(ids)] == ids and m[:len(ids)] == [-100] * len(ids) and m[len(ids):] == t[len(ids):]
        assert len(lp) == len(t) and lp[:len(ids)] == [1.0] * len(ids) and all(x <= 0 for x in lp[len(ids):])
        assert s == (1.0 if verify(text, item["answer"]) else 0.0)
    data = g.to_scored_data(env_id=3)
    assert data["env_id"] == 3 and data["policy_version"] == 7 and data["group_overrides"]["policy_version"] == 7
    assert set(env.evaluate(engine)) == {"eval/accuracy_greedy", "eval/stop_rate_greedy", "eval/samples_greedy",
                                         "eval/timeouts", "eval/errors"}


class FixedEngine(Engine):
    """Answers every prompt with the given texts (n of them), as a server would."""

    def __init__(self, tok, texts):
        self.tok, self.texts = tok, texts

    def generate(self, prompts, params):
        return [Completion(prompt_index=0, token_ids=self.tok(t)["input_ids"], logprobs=[-0.5] * len(t),
                           finish_reason="stop", version=2) for t in self.texts[:params.n]]


def test_gsm8k_environment_scores_with_math_verification():
    tok = build_char_tokenizer()
    env = make_environment("gsm8k", tok, data=str(SAMPLE), group_size=4, timeout_s=30, verifier_workers=1)
    try:
        env.setup()
        item = next(r for r in env.sampler.rows if gsm8k_gold(r["answer"]) == "18")
        assert item["prompt"].endswith("after \"####\".")
        g = env.collect(item, FixedEngine(tok, ["3*6=18 #### 18", "It is $18.0", "#### 17", "eighteen"]))
        assert g.scores == [1.0, 1.0, 0.0, 0.0] and env.scorer.timeouts == 0
    finally:
        env.scorer.close()


def test_verifier_timeouts_are_process_level_and_counted():
    from baton.rewards.registry import REWARD_FUNCTIONS, register_reward

    if "test/hang" not in REWARD_FUNCTIONS:  # a light module of its own: a fresh worker loads it fast
        spec = importlib.util.spec_from_file_location("hang_verifier", Path(__file__).parent / "hang_verifier.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["hang_verifier"] = module
        spec.loader.exec_module(module)
        register_reward("test/hang")(module.hang)
    scorer = MathScorer(timeout_s=1.0, workers=1, function="test/hang")
    try:
        t0 = time.monotonic()
        scores = scorer({"prompt": "q", "answer": "1"}, ["ok", "hang", "ok"])
        assert scores == [1.0, 0.0, 1.0] and scorer.timeouts == 1
        assert time.monotonic() - t0 < 20
    finally:
        scorer.close()
