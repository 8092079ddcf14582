"""Damaged or mismatched checkpoints are one `ModelLoadError` line (exit 2), for train, eval,
serve and export (issue 38): baton/models/validate.py. Each case damages a copy of the shipped
0.82M checkpoint (or a tiny llama written here) and runs `baton.cli.main` in the test's
process; the static cases fail before any model loads and before a run dir is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from baton.cli import main

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "checkpoints/arith-sft"  # qwen2, 0.82M, max_position_embeddings 256


def truncate(d: Path) -> None:
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[:w.stat().st_size // 2])


def other_size(d: Path) -> None:
    config = json.loads((d / "config.json").read_text())
    config["intermediate_size"] *= 2
    (d / "config.json").write_text(json.dumps(config))


def no_architectures(d: Path) -> None:
    config = json.loads((d / "config.json").read_text())
    del config["architectures"]
    (d / "config.json").write_text(json.dumps(config))


def llama_weights(d: Path, tmp: Path) -> None:
    from baton.models.make import make_tiny_checkpoint

    make_tiny_checkpoint(tmp / "llama", preset="0.75m", family="llama")
    shutil.copy(tmp / "llama/model.safetensors", d / "model.safetensors")


def tensors_edit(edit):
    def damage(d: Path) -> None:
        tensors = load_file(str(d / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return damage


def nan_weight(t: dict) -> None:
    t["model.layers.0.mlp.up_proj.weight"][0, 0] = float("nan")


# (id, damage(dir) or damage(dir, tmp), what the line says; {d} is the damaged dir)
CASES = [
    ("truncated-weights", truncate, "{d}/model.safetensors: is "),
    ("empty-weights", lambda d: (d / "model.safetensors").write_bytes(b""), "{d}/model.safetensors: is empty (0 bytes)"),
    ("torn-config", lambda d: (d / "config.json").write_text((SHIPPED / "config.json").read_text()[:200]),
     "{d}/config.json: not valid JSON"),
    ("empty-config", lambda d: (d / "config.json").write_text(""), "{d}/config.json: is empty"),
    ("config-a-list", lambda d: (d / "config.json").write_text("[]"), "{d}/config.json: must hold a JSON object"),
    ("another-size", other_size, "{d}: tensor 'model.layers.0.mlp.down_proj.weight' has shape [128, 384], Qwen2ForCausalLM as "
     "config.json describes it needs [128, 768]"),
    ("llama-in-qwen2", llama_weights, "{d}: the weights lack 12 tensor(s) that Qwen2ForCausalLM (config.json) has, "
                                      "e.g. 'model.layers.0.self_attn.q_proj.bias'"),
    ("missing-tensor", tensors_edit(lambda t: t.pop("model.norm.weight")), "{d}: the weights lack 1 tensor(s)"),
    ("unexpected-tensor", tensors_edit(lambda t: t.update(extra=torch.zeros(2))),
     "{d}: the weights hold 1 tensor(s) that Qwen2ForCausalLM (config.json) does not have, e.g. 'extra'"),
    ("nan-weight", tensors_edit(nan_weight), "{d}: weight 'model.layers.0.mlp.up_proj.weight' holds 1 NaN/inf"),
    ("no-tokenizer-json", lambda d: (d / "tokenizer.json").unlink(), "{d}: its tokenizer encodes text to no tokens"),
    # issue 50.5 (was: library tracebacks, exit 1)
    ("config-empty-object", lambda d: (d / "config.json").write_text("{}"), "{d}/config.json: names no model_type"),
    ("no-weights", lambda d: (d / "model.safetensors").unlink(), "{d}: holds a config.json but no weights"),
    ("no-architectures-other-size", lambda d: (other_size(d), no_architectures(d)),
     "{d}: tensor 'model.layers.0.mlp.down_proj.weight' has shape [128, 384], Qwen2ForCausalLM as"),
]
NEW_50 = [c for c in CASES if c[0] in ("config-empty-object", "no-weights")]
LOADED: set[str] = set()  # found only once the weights are in memory (none: a NaN in <= 2 GiB is found before)


def damaged(tmp_path: Path, damage) -> Path:
    d = tmp_path / "ckpt"
    shutil.copytree(SHIPPED, d)
    damage(d) if damage.__code__.co_argcount == 1 else damage(d, tmp_path)
    return d


def one_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.strip().splitlines()
             if "it/s]" not in line]  # transformers' "Loading weights" bar of a model that did load
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_eval_refuses_a_damaged_checkpoint_in_one_line(case, tmp_path, capsys):
    name, damage, says = case
    d = damaged(tmp_path, damage)
    capsys.readouterr()  # what building the damage printed
    assert main(["eval", str(d), "--n", "2"]) == 2
    err = one_line(capsys)
    assert err.startswith("baton: config error: ") and says.format(d=d) in err, err


@pytest.mark.parametrize("case", [c for c in CASES if c[0] not in LOADED], ids=[c[0] for c in CASES
                                                                                 if c[0] not in LOADED])
def test_train_refuses_a_damaged_checkpoint_before_the_run_dir(case, tmp_path, capsys):
    name, damage, says = case
    d = damaged(tmp_path, damage)
    capsys.readouterr()  # what building the damage printed
    run_dir = tmp_path / "run"
    assert main(["train", str(REPO / "recipes/grpo_arithmetic.yaml"), f"model.path={d}",
                 f"trainer.run_dir={run_dir}"]) == 2
    err = one_line(capsys)
    assert says.format(d=d) in err, err
    assert not run_dir.exists()


@pytest.mark.parametrize("command", ["serve", "export"])
def test_serve_and_export_refuse_a_damaged_checkpoint(command, tmp_path, capsys):
    d = damaged(tmp_path, truncate)
    argv = (["serve", str(d), "--port", "0"] if command == "serve" else
            ["export", str(d), str(tmp_path / "out"), "--merge", "--base", str(d)])
    if command == "export":  # an adapter dir over the damaged base
        (tmp_path / "adapter").mkdir()
        (tmp_path / "adapter/adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(d)}))
        save_file({}, str(tmp_path / "adapter/adapter_model.safetensors"))
        argv[1] = str(tmp_path / "adapter")
    assert main(argv) == 2
    assert f"{d}/model.safetensors: is " in one_line(capsys)


@pytest.mark.parametrize("case", NEW_50, ids=[c[0] for c in NEW_50])
@pytest.mark.parametrize("role", ["serve", "teacher"])
def test_serve_and_a_teacher_refuse_an_empty_config_or_no_weights(case, role, tmp_path, capsys):
    name, damage, says = case
    d = damaged(tmp_path, damage)
    capsys.readouterr()
    run_dir = tmp_path / "run"
    argv = (["serve", str(d), "--port", "0"] if role == "serve" else
            ["train", str(REPO / "recipes/grpo_arithmetic.yaml"), "algo.advantage=distill", f"teacher.path={d}",
             f"trainer.run_dir={run_dir}", "placement.auto=false"])
    assert main(argv) == 2
    assert says.format(d=d) in one_line(capsys)
    assert not run_dir.exists()


def test_the_shipped_checkpoint_passes():
    from baton.models.validate import check_checkpoint

    check_checkpoint(SHIPPED)  # tied lm_head: not in the file, and not missing


def test_launch_refuses_a_damaged_checkpoint_before_starting_anything(tmp_path, capsys):
    d = damaged(tmp_path, truncate)
    capsys.readouterr()
    run_dir = tmp_path / "run"
    assert main(["launch", str(REPO / "recipes/grpo_arithmetic_api.yaml"), f"model.path={d}",
                 f"trainer.run_dir={run_dir}"]) == 2
    assert f"{d}/model.safetensors: is " in one_line(capsys)
    assert not run_dir.exists()  # no API queue, no process started


def test_a_recomputed_buffer_an_older_file_holds_is_not_unexpected(tmp_path):
    """Older Llama files hold each layer's rotary `inv_freq` (a buffer the model recomputes):
    they load as before; a tensor the model has no buffer of that name for still refuses."""
    from baton.models.validate import ModelLoadError, check_checkpoint

    d = damaged(tmp_path, tensors_edit(lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq":
                                                            torch.ones(8)})))
    check_checkpoint(d)
    tensors_edit(lambda t: t.update({"model.layers.0.self_attn.rotary_emb.freq": torch.ones(8)}))(d)
    with pytest.raises(ModelLoadError, match="rotary_emb.freq"):
        check_checkpoint(d)


@pytest.mark.parametrize("preset", ["qwen3-moe", "mixtral"])
def test_a_mixture_of_experts_file_is_checked_in_the_layout_it_is_saved_in(preset, tmp_path, capsys):
    """transformers saves the experts one tensor each and stacks them on load: the check maps
    the file's names to the module's (a sound file passes) and refuses a missing expert's tensor
    or an unexpected one before the run dir (was: a traceback from transformers' conversion)."""
    from baton.models.make import make_tiny_checkpoint
    from baton.models.validate import ModelLoadError, check_checkpoint

    d = make_tiny_checkpoint(tmp_path / "moe", preset=preset)
    check_checkpoint(d)
    piece = next(k for k in load_file(str(d / "model.safetensors")) if ".experts.2." in k)
    tensors_edit(lambda t: t.pop(piece))(d)
    with pytest.raises(ModelLoadError, match=r"(7 of the 8|3 of the 4) per-expert tensors"):
        check_checkpoint(d)
    capsys.readouterr()
    run_dir = tmp_path / "run"
    assert main(["train", str(REPO / "recipes/grpo_arithmetic.yaml"), f"model.path={d}",
                 f"trainer.run_dir={run_dir}"]) == 2
    assert "per-expert tensors" in one_line(capsys) and not run_dir.exists()
