"""The actor with `model.lora`: only the adapters train, the reference is the same module
with its adapters off, checkpoints hold the adapter (PEFT format) and `baton export --merge`
turns one into a plain HF checkpoint; a whole GRPO run with LoRA and KL wires it all (no
reference model is built; the colocated engine reads the live adapters)."""

from __future__ import annotations

import json

import pytest
import torch

from baton import fields as F
from baton.batch import Batch
from baton.cli import main
from baton.config import load_config
from baton.controller import ResourcePool, WorkerGroup
from baton.metrics import read_metrics
from baton.models.load import load_model
from baton.models.make import make_tiny_checkpoint
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig
from baton.workers.actor import ActorWorker
from baton.workers.sequences import batched_logprobs

LORA = ["model.lora.rank=4", "model.lora.alpha=8"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=1))


def rollout_batch(rows=8, P=5, R=6, vocab=50) -> Batch:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(rows, R, dtype=torch.long)
    for i in range(rows):
        mask[i, 1 + i % R:] = 0
    return Batch({F.PROMPT_IDS: torch.randint(4, vocab, (rows, P), generator=g),
                  F.PROMPT_MASK: torch.ones(rows, P, dtype=torch.long),
                  F.RESPONSE_IDS: torch.randint(4, vocab, (rows, R), generator=g), F.RESPONSE_MASK: mask,
                  F.OLD_LOGPROBS: -torch.rand(rows, R, generator=g),
                  F.ADVANTAGES: torch.randn(rows, 1, generator=g).expand(rows, R).clone()})


def test_only_adapters_train_and_the_reference_is_the_base(model_dir, tmp_path):
    cfg = load_config(PPOConfig, overrides=[f"model.path={model_dir}", "data.prompts_per_step=2", "rollout.n=4",
                                             "actor.lr=1e-2", *LORA])
    group = WorkerGroup(ResourcePool(1), ActorWorker, cfg.model, cfg.actor, cfg.algo, temperature=1.0,
                        max_new_tokens=6, total_steps=2, seed=0)
    try:
        actor = group.pool.backend.host.roles[group.role]
        trainable = {n for n, p in actor.model.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in n for n in trainable)
        assert sum(len(g["params"]) for g in actor.optim.param_groups) == len(trainable)
        batch = rollout_batch()
        base = load_model(model_dir)
        for _ in range(2):
            group.update(batch)
        # the base weights did not move; the policy did
        live = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
                for n, p in actor.model.named_parameters() if "lora_" not in n}
        assert all(torch.equal(live[n], p) for n, p in base.named_parameters())
        ref = group.compute_ref_logprobs(batch).get()[F.REF_LOGPROBS]
        want = batched_logprobs(base, batch, 8)["logprobs"]
        assert (ref - want).abs().max() < 1e-5
        policy = group.compute_logprobs(batch).get()[F.OLD_LOGPROBS]
        assert (policy - want).abs().max() > 1e-3
        ckpt = tmp_path / "ckpt"
        group.save_checkpoint(str(ckpt), {"step": 2})
        names = {p.name for p in ckpt.iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt"} <= names
        assert "model.safetensors" not in names
        assert json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"].endswith("tiny")
    finally:
        group.shutdown()
    # resume: a fresh actor loading the adapter gives the same policy logprobs
    again = WorkerGroup(ResourcePool(1), ActorWorker, cfg.model, cfg.actor, cfg.algo, temperature=1.0,
                        max_new_tokens=6, total_steps=2, seed=5)
    try:
        assert again.load_checkpoint(str(ckpt))[0] == {"step": 2}
        assert torch.equal(again.compute_logprobs(batch).get()[F.OLD_LOGPROBS], policy)
    finally:
        again.shutdown()
    # baton export --merge: one plain HF checkpoint with the policy's logprobs
    assert main(["export", str(ckpt), str(tmp_path / "merged"), "--merge"]) == 0
    merged = load_model(tmp_path / "merged")
    assert (batched_logprobs(merged, batch, 8)["logprobs"] - policy).abs().max() < 1e-5


@pytest.mark.slow  # a whole (2-step) run: ~70 s here
def test_grpo_with_lora_and_kl_builds_no_reference_model(model_dir, tmp_path):
    cfg = load_config(PPOConfig, "recipes/grpo_arithmetic.yaml", [
        f"model.path={model_dir}", f"trainer.run_dir={tmp_path}", "data.prompts_per_step=4", "data.eval_size=4",
        "rollout.n=4", "rollout.max_new_tokens=6", "actor.micro_batch_size=16", "actor.mini_batch_size=16",
        "actor.lr=1e-2", "trainer.progress=false", "trainer.steps=2", "algo.kl_coef=0.1",
        "trainer.check_weight_sync=true", *LORA])
    train(cfg)  # check_weight_sync: the engine's logprobs (live adapters) equal the trainer's
    steps = [r for r in read_metrics(tmp_path) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["actor/kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy == base (lora_B = 0)
    assert (tmp_path / "checkpoints" / "step_2" / "adapter_model.safetensors").exists()
