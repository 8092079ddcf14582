"""Prompt loaders and the seeded, resumable sampler."""

import json

import pytest

from baton.data import PromptSampler, load_jsonl, load_prompts

ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]


def draw(sampler, sizes):
    return [[r["prompt"] for r in sampler.next_batch(n)] for n in sizes]


def test_sampler_is_seeded_and_covers_each_epoch():
    a, b, c = PromptSampler(ROWS, seed=1), PromptSampler(ROWS, seed=1), PromptSampler(ROWS, seed=2)
    assert draw(a, [4, 4, 4]) == draw(b, [4, 4, 4])
    assert draw(PromptSampler(ROWS, seed=1), [10]) != draw(c, [10])
    s = PromptSampler(ROWS, seed=3)
    e0, e1 = draw(s, [10, 10])
    assert sorted(e0) == sorted(e1) == sorted(r["prompt"] for r in ROWS)  # each epoch is a permutation
    assert e0 != e1  # reshuffled between epochs
    assert s.state_dict()["epoch"] == 1 and s.state_dict()["position"] == 10


def test_resume_sees_the_same_order_as_an_uninterrupted_run():
    sizes = [3, 4, 7, 5, 2, 6]
    full = draw(PromptSampler(ROWS, seed=5), sizes)
    first = PromptSampler(ROWS, seed=5)
    head = draw(first, sizes[:3])  # 14 rows: crosses into epoch 1
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    resumed = PromptSampler(ROWS, seed=5)
    resumed.load_state_dict(state)
    assert head + draw(resumed, sizes[3:]) == full
    with pytest.raises(ValueError):
        PromptSampler(ROWS[:5], seed=5).load_state_dict(state)


def test_unshuffled_sampler_keeps_file_order():
    assert draw(PromptSampler(ROWS, shuffle=False), [12])[0] == [r["prompt"] for r in ROWS + ROWS[:2]]


def test_load_jsonl_source(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"question": r["prompt"], "answer": r["answer"]}) for r in ROWS) + "\n\n")
    rows = load_jsonl(path, prompt_key="question")
    assert rows == ROWS
    assert load_prompts(str(path), n=3, prompt_key="question") == ROWS[:3]
    with pytest.raises(ValueError, match="no 'prompt'"):
        load_jsonl(path)
    with pytest.raises(FileNotFoundError):
        load_prompts(str(tmp_path / "missing.jsonl"))
