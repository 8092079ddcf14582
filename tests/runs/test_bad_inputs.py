"""Bad inputs are one line and exit 2 before anything runs (issue 38): every data file a
recipe names (train `data.path`, `data.eval_path`, SFT rows, DPO and reward-model pairs) is
read and checked before the model loads and before the run dir is written
(baton/trainers/session/inputs.py). Each case runs `baton.cli.main` in the test's process:
it must fail before any model loads, so each takes well under a second here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runs_helpers import REPO

from baton.cli import main

MODEL = str(REPO / "checkpoints/arith-sft")  # context 256 (max_position_embeddings), a char-level tokenizer
RECIPES = {"grpo": "recipes/grpo_arithmetic.yaml", "dpo": "recipes/offline_dpo_arithmetic.yaml",
           "rm": "recipes/rm_arithmetic.yaml", "sft": "recipes/sft_arithmetic.yaml"}
ROW = {"prompt": "1+2=", "answer": "3"}
PAIR = {"prompt": "1+2=", "chosen": "3", "rejected": "4"}


def jsonl(*rows) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def rows(n: int = 20) -> list[dict]:
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(n)]


def parquet_bytes(tmp: Path) -> bytes:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist(rows(20)), tmp / "ok.parquet")
    return (tmp / "ok.parquet").read_bytes()


# (id, algorithm, file name, content (bytes, or a callable of tmp_path), extra overrides, what the line says)
# {f} in `says` is the data file's path.
CASES = [
    ("json-mid-file", "grpo", "d.jsonl", jsonl(*rows(5), b'{"prompt": "1+1=", "answer": ', *rows(5)), [],
     "{f}:6: not JSON"),
    ("row-is-a-list", "grpo", "d.jsonl", jsonl(*rows(3), ["1+1=", "2"]), [], "{f}:4: a row must be a JSON object"),
    ("row-is-a-string", "grpo", "d.jsonl", jsonl("1+1="), [], "{f}:1: a row must be a JSON object"),
    ("not-utf8", "grpo", "d.jsonl", jsonl(*rows(2), b'{"prompt": "caf\xe9", "answer": "1"}'), [],
     "{f}:3: not UTF-8"),
    ("no-answer", "grpo", "d.jsonl", jsonl(*rows(12), {"prompt": "1+1="}), [], "{f}:13: no 'answer' field"),
    ("null-answer", "grpo", "d.jsonl", jsonl({"prompt": "1+1=", "answer": None}), [], "{f}:1: no 'answer' field"),
    ("empty-prompt", "grpo", "d.jsonl", jsonl(*rows(2), {"prompt": "", "answer": "1"}), [],
     "{f}:3: field 'prompt' is empty"),
    ("blank-prompt", "grpo", "d.jsonl", jsonl({"prompt": "  \t", "answer": "1"}), [],
     "{f}:1: field 'prompt' is empty"),
    ("empty-messages", "grpo", "d.jsonl", jsonl({"prompt": [], "answer": "1"}), [],
     "{f}:1: field 'prompt' is empty"),
    ("prompt-a-number", "grpo", "d.jsonl", jsonl({"prompt": 12, "answer": "1"}), [],
     "{f}:1: field 'prompt' must be a string"),
    ("prompt-bad-messages", "grpo", "d.jsonl", jsonl({"prompt": [{"text": "hi"}], "answer": "1"}), [],
     "{f}:1: field 'prompt': a list prompt must be chat messages"),
    ("no-prompt", "grpo", "d.jsonl", jsonl({"text": "1+1=", "answer": "2"}), [], "{f}:1: no 'prompt'"),
    ("a-directory", "grpo", "d.jsonl", "dir", [], "data.path={f}: is a directory"),
    ("empty-file", "grpo", "d.jsonl", b"", [], "data.path={f}: holds no rows"),
    ("blank-lines-only", "grpo", "d.jsonl", b"\n\n  \n", [], "data.path={f}: holds no rows"),
    ("one-row-held-out", "grpo", "d.jsonl", jsonl(ROW), [], "data.path={f}: all of its 1 row(s) are held out"),
    ("bad-parquet", "grpo", "d.parquet", lambda tmp: parquet_bytes(tmp)[:200], [],
     "data.path={f}: not a readable parquet file"),
    ("json-not-a-list", "grpo", "d.json", json.dumps(ROW).encode(), [], "{f}: a .json data file must hold a list"),
    ("json-torn", "grpo", "d.json", json.dumps(rows(5), indent=1).encode()[:-30], [], "{f}:19: not JSON"),
    ("json-list-of-lists", "grpo", "d.json", json.dumps([["1+1=", "2"]]).encode(), [],
     "{f} row 1: a row must be a JSON object"),
    ("bad-eval-path", "grpo", "e.jsonl", jsonl(ROW, {"prompt": "2+2="}), ["data.path={good}"],
     "{f}:2: no 'answer' field"),
    ("eval-path-dir", "grpo", "e.jsonl", "dir", ["data.path={good}"], "data.eval_path={f}: is a directory"),
    ("long-row-chars", "grpo", "d.jsonl", jsonl(*rows(12), {"prompt": "1+" * 300_000 + "1=", "answer": "1"}), [],
     "{f}:13: the row is 600,002 characters"),
    ("long-row-tokens", "grpo", "d.jsonl", jsonl(*rows(12), {"prompt": "1+" * 126 + "1=", "answer": "1"}), [],
     "{f}:13: the row is 254 tokens; with 4 more (rollout.max_new_tokens) that is 258, longer than the "
     "model's context of 256 tokens"),
    ("dpo-no-rejected", "dpo", "p.jsonl", jsonl(PAIR, {"prompt": "1+1=", "chosen": "2"}), [],
     "{f}:2: field 'rejected' missing or not a string"),
    ("dpo-chosen-a-number", "dpo", "p.jsonl", jsonl({**PAIR, "chosen": 3}), [], "{f}:1: field 'chosen'"),
    ("dpo-all-identical", "dpo", "p.jsonl", jsonl({**PAIR, "rejected": "3"}), [],
     "data.path={f}: every pair has chosen == rejected"),
    ("dpo-json", "dpo", "p.jsonl", jsonl(PAIR, b"{oops"), [], "{f}:2: not JSON"),
    ("dpo-empty", "dpo", "p.jsonl", b"", [], "data.path={f}: holds no rows"),
    ("dpo-empty-prompt", "dpo", "p.jsonl", jsonl({**PAIR, "prompt": ""}), [], "{f}:1: field 'prompt' is empty"),
    ("dpo-long", "dpo", "p.jsonl", jsonl(PAIR, {**PAIR, "chosen": "9" * 300}), [], "{f}:2: the row is"),
    ("dpo-eval-bad", "dpo", "e.jsonl", jsonl(["x"]), ["data.path={good_pairs}"],
     "{f}:1: a row must be a JSON object"),
    ("rm-no-chosen", "rm", "p.jsonl", jsonl({"prompt": "1+1=", "rejected": "3"}), [], "{f}:1: field 'chosen'"),
    ("rm-not-utf8", "rm", "p.jsonl", b'{"prompt": "\xff"}\n', [], "{f}:1: not UTF-8"),
    ("sft-no-answer", "sft", "d.jsonl", jsonl(*rows(3), {"prompt": "1+1="}), [], "{f}:4: no 'answer' field"),
    ("sft-one-row", "sft", "d.jsonl", jsonl(ROW), [], "data.path={f}: all of its 1 row(s) are held out"),
    ("sft-target-not-held", "sft", "d.jsonl", jsonl(*({"prompt": f"{i}+1=", "target": "x"} for i in range(20))), [],
     "data.path={f}: the held-out row '0+1=' has no 'answer' field"),
    ("sft-neither", "sft", "d.jsonl", jsonl({"prompt": "1+1="}), [], "{f}:1: no 'answer' field (GSM8K 'answer', verl "
     "'reward_model.ground_truth') or 'target'"),
    ("sft-list-row", "sft", "d.jsonl", jsonl([1, 2]), [], "{f}:1: a row must be a JSON object"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_bad_data_file_is_one_line_and_exit_2_before_the_run_dir(case, tmp_path, capsys):
    name, algorithm, filename, content, extra, says = case
    good, good_pairs = tmp_path / "good.jsonl", tmp_path / "good_pairs.jsonl"
    good.write_bytes(jsonl(*rows(20)))
    good_pairs.write_bytes(jsonl(PAIR, PAIR))
    data = tmp_path / filename
    if content == "dir":
        data.mkdir()
    else:
        data.write_bytes(content(tmp_path) if callable(content) else content)
    key = "data.eval_path" if filename.startswith("e.") else "data.path"
    run_dir = tmp_path / "run"
    model = [] if algorithm == "sft" else [f"model.path={MODEL}"]
    argv = ["train", str(REPO / RECIPES[algorithm]), *model, f"{key}={data}", f"trainer.run_dir={run_dir}",
            *(e.format(good=good, good_pairs=good_pairs) for e in extra)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("baton: data error: ") and says.format(f=data) in err, err
    assert not run_dir.exists()  # nothing written: not even the lock


def test_a_byte_order_mark_is_accepted(tmp_path):
    from baton.data.records import load_rows

    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + jsonl(ROW, ROW))
    assert load_rows(path) == [ROW, ROW]
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps([ROW]).encode())
    assert load_rows(tmp_path / "bom.json") == [ROW]


def test_identical_pairs_are_left_out_and_counted(tmp_path, caplog):
    from baton.data.records import load_pairs

    path = tmp_path / "p.jsonl"
    path.write_bytes(jsonl(PAIR, {**PAIR, "rejected": "3"}, PAIR))
    assert load_pairs(path) == [PAIR, PAIR]
    assert f"1 of 3 pairs have chosen == rejected (the first: {path}:2)" in caplog.text


@pytest.mark.parametrize("flags", [["--data"], ["--data", "--eval-data"]])
def test_baton_eval_checks_its_rows_before_the_model_loads(flags, tmp_path, capsys, monkeypatch):
    import baton.models.load as load

    monkeypatch.setattr(load, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    bad = tmp_path / "d.jsonl"
    bad.write_bytes(jsonl(*rows(20), {"prompt": "1+" * 300_000 + "1=", "answer": "1"}))
    argv = ["eval", MODEL, *(x for flag in flags for x in (flag, str(bad)))]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{bad}:21: the row is 600,002 characters" in err, err


@pytest.mark.parametrize("text, says", [("model: [unclosed\n", ":2:1: not valid YAML"),
                                        ("data:\n  task: arithmetic\n   eval_size: 3\n", ":3:13: not valid YAML")])
def test_a_recipe_that_is_not_yaml_is_one_line(text, says, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    assert main(["train", str(recipe), f"trainer.run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"baton: config error: {recipe}{says}" in err, err
    assert not (tmp_path / "run").exists()


def test_a_torn_run_dir_config_yaml_is_one_line(tmp_path, capsys):
    from baton.runs.fsutil import YAMLFileError
    from baton.runs.resume_checks import check_resume_changes

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("model:\n  path: checkpoints/arith-sft\ndata: {task: arith")
    with pytest.raises(YAMLFileError, match="config.yaml:3:.*not valid YAML.*a torn write"):
        check_resume_changes(run_dir, {}, allow=False)
    argv = ["train", str(REPO / RECIPES["grpo"]), f"model.path={MODEL}", f"trainer.run_dir={run_dir}",
            "trainer.resume=auto", "placement.auto=true"]  # auto keeps what the resumed run's config.yaml chose
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{run_dir / 'config.yaml'}:3:" in err and "a torn write?" in err, err


USER_MODULES = {
    "raises": ("import os\nraise RuntimeError('no API key in the environment')\n",
               "importing 'i38_raises' failed: RuntimeError: no API key in the environment ({path}:2)"),
    "syntax": ("def score(prompt, completion, **kw):\n    return 1.0 +\n",
               "importing 'i38_syntax' failed: SyntaxError: invalid syntax ({path}:2)"),
    "missing_import": ("import i38_not_installed_anywhere\n",
                       "importing 'i38_missing_import' failed: ModuleNotFoundError: No module named "
                       "'i38_not_installed_anywhere' ({path}:1)"),
}


@pytest.mark.parametrize("kind", ["reward", "task"])
@pytest.mark.parametrize("module", sorted(USER_MODULES))
def test_a_user_module_that_fails_to_import_is_one_line_with_its_own_error(module, kind, tmp_path, capsys,
                                                                          monkeypatch):
    text, says = USER_MODULES[module]
    name = f"i38_{module}"
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    key = ["reward.functions={" + f"'{name}:score'" + ": 1.0}"] if kind == "reward" else [f"data.task={name}:Task"]
    argv = ["train", str(REPO / RECIPES["grpo"]), f"model.path={MODEL}", f"trainer.run_dir={tmp_path / 'run'}", *key]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says.format(path=path) in err, err
    assert not (tmp_path / "run").exists()
