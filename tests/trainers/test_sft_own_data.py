"""`baton sft` on a user's data: rows from `data.path` (a `target` field, or the task's
target of baton's / GSM8K's shape), held-out rows from `data.eval_path`, and a user task
named `module:Class` as `baton train` takes it."""

import json
import sys

import pytest

from baton.config import ConfigError, load_config
from baton.models import build_char_tokenizer
from baton.trainers.sft import SFTConfig, encode_examples, run_sft, sft_rows, target_of

TINY = ["model.overrides={layers: 1}", "trainer.batch_size=4", "trainer.steps=2", "trainer.progress=false",
        "optim.lr_warmup_steps=1", "data.eval_samples=1"]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_row_s_target_field_wins_over_the_task_s_target():
    from baton.envs import get_task

    task = get_task("arithmetic")
    assert target_of(task, {"prompt": "1+2=", "target": "three"}) == "three"
    assert target_of(task, {"prompt": "1+2=", "answer": "3"}) == "3"  # baton's shape: the task's target (answer)
    tok = build_char_tokenizer()
    [(ids, plen)] = encode_examples(tok, task, [{"prompt": "1+2=", "target": "3"}])
    assert plen == 4 and ids[plen:] == tok("3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def test_sft_trains_on_a_jsonl_of_prompt_target(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"{i}+1=", "target": str(i + 1)} for i in range(20)])
    held = write_jsonl(tmp_path / "held.jsonl", [{"prompt": "7+7=", "answer": "14"}, {"question": "2+2=",
                                                                                    "answer": "4"}])
    cfg = load_config(SFTConfig, overrides=[*TINY, f"data.path={train}", f"data.eval_path={held}",
                                            f"trainer.run_dir={tmp_path / 'run'}"])
    rows, eval_rows = sft_rows(cfg.data)
    assert len(rows) == 20 and [r["prompt"] for r in eval_rows] == ["7+7=", "2+2="]  # GSM8K's question too
    res = run_sft(cfg)
    assert len(res["losses"]) == 2 and 0.0 <= res["eval/accuracy_greedy"] <= 1.0
    assert res["eval/samples_greedy"] == 2  # the file's held-out rows, not the task's


def test_sft_holds_out_every_10th_row_without_an_eval_file(tmp_path):
    train = write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(30)])
    cfg = load_config(SFTConfig, overrides=[f"data.path={train}", "data.eval_size=2"])
    rows, held = sft_rows(cfg.data)
    assert len(rows) == 27 and [r["prompt"] for r in held] == ["0+0=", "10+0="]


def test_sft_takes_a_user_task(tmp_path, monkeypatch):
    (tmp_path / "sft_user_task.py").write_text(
        "from baton.envs.arithmetic import ArithmeticTask\n"
        "class Doubles(ArithmeticTask):\n"
        "    def __init__(self):\n"
        "        super().__init__(name='doubles', min_terms=2, max_terms=2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sft_user_task", raising=False)
    cfg = load_config(SFTConfig, overrides=[*TINY, "data.task=sft_user_task:Doubles", "data.num_examples=16",
                                            "data.eval_size=2", f"trainer.run_dir={tmp_path / 'run'}"])
    res = run_sft(cfg)
    assert len(res["losses"]) == 2 and res["eval/samples_greedy"] == 2


def test_sft_refuses_an_eval_file_without_a_train_file_and_an_unknown_task():
    with pytest.raises(ConfigError, match="data.eval_path is read only with data.path"):
        load_config(SFTConfig, overrides=["data.eval_path=held.jsonl"])
    with pytest.raises(ConfigError, match="data.task='nope' is not one of"):
        load_config(SFTConfig, overrides=["data.task=nope"])
