"""One recipe per scale (recipes/grpo_qwen05b_gsm8k.yaml: Qwen2.5-0.5B-Instruct on one GPU;
recipes/grpo_7b_8gpu.yaml: a 7B model on 8 GPUs, FSDP2 and vLLM), checked on the CPU: each
resolves to a valid config against a model directory of its real shape (config.json of that
shape; the placeholder weights file is never read: the size comes from the config alone), and
placement.auto's decision for its machine (1 GPU; 8 GPUs) is what the recipe says. The 0.5B
recipe also trains one tiny step on the CPU with random weights of its shape (slow). A hub id
as model.path resolves through huggingface_hub's cache, and without network is one line with
the download command."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from baton.config import ConfigError
from baton.trainers.algorithms import explicit_keys, load_recipe
from baton.trainers.placement.auto import choose, count_model_params, view_from_config

REPO = Path(__file__).resolve().parents[1]
QWEN05 = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)
QWEN7 = dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
             intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)


def shaped_dir(path: Path, shape: dict) -> Path:
    """A model directory of `shape`: its config.json (what the config and placement read) and a
    weights file with the architecture's tensors as a sparse file (the checkpoint check reads
    its header and its length, nothing loads the values: a 7B file takes no disk)."""
    import json
    import shutil
    import struct

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**shape, architectures=["Qwen2ForCausalLM"])
    config.save_pretrained(path)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    header, offset = {}, 0
    for name, t in model.state_dict().items():
        if shape.get("tie_word_embeddings") and name == "lm_head.weight":
            continue
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + 2 * t.numel()]}
        offset += 2 * t.numel()
    head = json.dumps(header).encode()
    with open(path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.truncate(8 + len(head) + offset)  # sparse: no bytes written for the values
    for tok in (REPO / "checkpoints" / "arith-sft").glob("*token*"):  # rows are measured against the context
        shutil.copy(tok, path / tok.name)
    return path


def resolved(recipe: str, model_dir: Path, *extra: str):
    cfg = load_recipe("grpo", str(REPO / "recipes" / recipe), [f"model.path={model_dir}", *extra])
    return cfg, count_model_params(str(model_dir))


def test_the_05b_recipe_resolves_and_places_on_one_gpu(tmp_path, capsys):
    cfg, params = resolved("grpo_qwen05b_gsm8k.yaml", shaped_dir(tmp_path / "q05", QWEN05), "placement.auto=true")
    assert 490e6 < params < 500e6  # Qwen2.5-0.5B: 494M
    assert (cfg.data.task, cfg.rollout.engine, cfg.actor.activation_checkpointing) == ("gsm8k", "embedded", True)
    assert (cfg.placement.world_size, cfg.placement.gpus_per_worker) == (1, 1)
    view = view_from_config(cfg, explicit_keys({"placement": {"world_size": 1, "gpus_per_worker": 1}}))
    c = choose(16, 1, params, view, idle_cores=16)  # the machine it is for: one GPU, 16 cores
    assert (c.world_size, c.backend, c.devices()) == (1, "local", "cuda:0")


def test_the_7b_recipe_resolves_and_places_a_rank_per_gpu(tmp_path):
    cfg, params = resolved("grpo_7b_8gpu.yaml", shaped_dir(tmp_path / "q7", QWEN7))
    assert 7.0e9 < params < 8.0e9  # Qwen2.5-7B: 7.6B
    assert (cfg.actor.strategy, cfg.rollout.engine, cfg.actor.activation_checkpointing) == ("fsdp2", "vllm", True)
    p = cfg.placement
    assert (p.backend, p.world_size, p.gpus_per_worker) == ("ray", 8, 1)
    assert cfg.data.prompts_per_step % p.world_size == 0 and cfg.actor.mini_batch_size % p.world_size == 0
    view = view_from_config(cfg, explicit_keys({"placement": {"backend": "ray", "world_size": 8,
                                                              "gpus_per_worker": 1}}))
    c = choose(128, 8, params, view, idle_cores=128)  # 8 GPUs, 128 cores: 16 threads a rank
    assert (c.world_size, c.backend, c.devices(), c.threads_per_worker) == (8, "ray", "cuda:0..7 (one per rank)", 16)


def test_a_hub_id_resolves_from_the_hub_cache(tmp_path, monkeypatch):
    """huggingface_hub's own cache layout (models--owner--name/snapshots/REV, refs/main): the
    id becomes that snapshot directory before anything validates or writes the config."""
    import huggingface_hub.constants as hub

    from baton.models.make import make_tiny_checkpoint

    repo = tmp_path / "hub" / "models--someone--tiny"
    make_tiny_checkpoint(repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    cfg = load_recipe("grpo", str(REPO / "recipes/grpo_arithmetic.yaml"), ["model.path=someone/tiny",
                                                                            "placement.auto=false"])
    assert Path(cfg.model.path) == repo / "snapshots" / "abc123"


def test_a_hub_id_without_network_is_one_line_with_the_download_command(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)  # as with no network: nothing cached, nothing fetched
    with pytest.raises(ConfigError) as e:
        load_recipe("grpo", str(REPO / "recipes/grpo_qwen05b_gsm8k.yaml"), [])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model.path=Qwen/Qwen2.5-0.5B-Instruct: not a local directory")
    assert "`hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir models/Qwen2.5-0.5B-Instruct`" in msg
    assert msg.endswith("then model.path=models/Qwen2.5-0.5B-Instruct")
    # the command it names is one the installed huggingface_hub has (2.x has `hf`, no `huggingface-cli`)
    command = msg.split("`")[1].split()[0]
    assert shutil.which(command, path=str(Path(sys.executable).parent)), command


def test_download_hints_name_the_installed_cli():
    """Every download hint in the repository (README, recipes' headers, docs, code) names `hf`:
    huggingface_hub 1.0 dropped `huggingface-cli` (a new user's trial ran the old name)."""
    assert shutil.which("hf", path=str(Path(sys.executable).parent))
    old = [str(p.relative_to(REPO)) for p in [REPO / "README.md", *REPO.glob("recipes/**/*.yaml"),
                                              *REPO.glob("docs/*.md"), *REPO.glob("baton/**/*.py")]
           if "huggingface" + "-cli" in p.read_text()]
    assert not old, old


@pytest.mark.slow  # a 494M-parameter model on the CPU: 63 s at load 4 on 2 cores (random weights built and saved)
def test_the_05b_recipe_trains_a_step_on_the_cpu_with_random_weights(tmp_path):
    sys.path.insert(0, str(REPO / "bench"))
    from _common import random_model_dir  # bench/_common.py: the Qwen2.5-0.5B shape, random weights

    from baton.trainers.algorithms import driver

    model = random_model_dir("qwen2.5-0.5b", tmp_path / "q05")
    cfg = load_recipe("grpo", str(REPO / "recipes/grpo_qwen05b_gsm8k.yaml"), [
        f"model.path={model}", "placement.auto=false", "placement.gpus_per_worker=0", "trainer.steps=1",
        "data.prompts_per_step=1", "rollout.n=2", "rollout.max_new_tokens=8", "actor.mini_batch_size=0",
        "actor.micro_batch_size=2", "data.eval_size=1", "trainer.eval_every=0", "trainer.save_every=0",
        "trainer.progress=false", f"trainer.run_dir={tmp_path / 'run'}"])
    driver("grpo")(cfg)
    from baton.metrics import read_metrics

    steps = [r for r in read_metrics(tmp_path / "run") if r.get("step") == 1 and "actor/loss" in r]
    assert steps and steps[0]["rollout/tokens"] > 0
