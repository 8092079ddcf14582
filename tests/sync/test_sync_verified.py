"""`sync/verified` (issue 49): 1 when the engine holds exactly the trainer's weights after a
sync, 0 otherwise; 1 on every step of the demo recipe (a short run, read from metrics.jsonl)."""

from __future__ import annotations

import json

import pytest
import torch

from baton.models.tiny import build_tiny_model
from baton.sync.verify import held_exactly


def tiny():
    return build_tiny_model(None, family="llama", hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, seed=0)


def test_held_exactly_by_storage_by_bytes_and_a_flipped_byte(monkeypatch):
    import baton.sync.verify as verify

    trainer = tiny()
    read = []
    real = verify.same_bytes
    monkeypatch.setattr(verify, "same_bytes", lambda a, b: read.append(1) or real(a, b))
    assert held_exactly(dict(trainer.named_parameters()), trainer.named_parameters()) == (True, None)
    assert read == []  # the engine reads the trainer's module (inplace): nothing to compare
    copy = {n: p.detach().clone() for n, p in trainer.named_parameters()}
    assert held_exactly(copy, trainer.named_parameters()) == (True, None)
    assert held_exactly({n: t.bfloat16() for n, t in copy.items()}, trainer.named_parameters()) == (True, None)
    name = "model.norm.weight"
    copy[name].view(-1).view(torch.uint8)[0] ^= 1  # one byte of the engine's copy
    assert held_exactly(copy, trainer.named_parameters()) == (False, name)
    del copy[name]
    assert held_exactly(copy, trainer.named_parameters()) == (False, name)
    assert held_exactly({f"module.{n}": t for n, t in copy.items()}, []) == (True, None)


@pytest.mark.parametrize("weight_sync", ["auto", "copy"])  # the engine reads the trainer's module; its own copy
def test_the_demo_recipe_is_verified_on_every_step(tmp_path, weight_sync):
    from baton.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "recipes/grpo_arithmetic.yaml", "trainer.steps=3", "data.prompts_per_step=8",
                 f"rollout.weight_sync={weight_sync}",
                 "actor.mini_batch_size=64", "actor.micro_batch_size=64", "data.eval_size=8", "trainer.eval_every=0",
                 f"trainer.run_dir={run_dir}"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/loss" in r]
    assert len(steps) == 3 and [r["sync/verified"] for r in steps] == [1.0, 1.0, 1.0], steps
    moved = {r["sync/bytes"] for r in steps}  # inplace: nothing moves; copy: the whole model, copied in
    assert moved == {0.0} if weight_sync == "auto" else len(moved) == 1 and moved.pop() > 1e6, steps
    assert all(r["sync/seconds"] >= 0 for r in steps)


def test_an_agent_run_is_verified_on_every_step(tmp_path):
    """The agent path samples with the same colocated engine (its source declares
    `checks_sync`): every step says so too."""
    from baton.cli import main
    from baton.sources import SOURCES

    assert [n for n, s in SOURCES.items() if s.checks_sync] == ["rollout", "api", "agent"]
    run_dir = tmp_path / "run"
    assert main(["train", "recipes/agent_guess.yaml", "trainer.steps=2", "data.prompts_per_step=2", "rollout.n=4",
                 "data.eval_size=4", "trainer.eval_every=0", "agent.max_turns=2", "actor.micro_batch_size=8",
                 "actor.mini_batch_size=8", "model.path=checkpoints/arith-sft", f"trainer.run_dir={run_dir}"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/loss" in r]
    assert len(steps) == 2 and [r["sync/verified"] for r in steps] == [1.0, 1.0], steps
