"""Mixture-of-experts models (issue 54): the tiny Qwen3-MoE and Mixtral presets train, resume and
export; the routers' load-balancing loss; routing replay (baton.models.moe)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from baton.cli import main
from baton.models.moe import RouterWatch, load_balancing_loss, replay_routing, routers
from baton.models.tiny import build_tiny_model
from baton.runs.checkpoints import list_checkpoints

RL = ["data.prompts_per_step=2", "rollout.n=2", "data.eval_size=2", "actor.mini_batch_size=0",
      "actor.micro_batch_size=4", "trainer.progress=false", "rollout.max_new_tokens=6"]
LORA = ["model.lora.rank=4", "model.lora.alpha=8", "actor.lr=1e-3"]


@pytest.fixture(scope="module", params=["qwen3-moe", "mixtral"])
def moe_dir(request, tmp_path_factory) -> tuple[str, Path]:
    path = tmp_path_factory.mktemp(request.param) / "model"
    assert main(["make-tiny", str(path), "--preset", request.param]) == 0
    return request.param, path


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step"' in line]


def _train(model: Path, run_dir: Path, steps: int, *extra: str) -> None:
    code = main(["train", "recipes/grpo_arithmetic.yaml", f"model.path={model}", *RL, f"trainer.run_dir={run_dir}",
                 f"trainer.steps={steps}", *extra])
    assert code == 0


def test_make_tiny_moe_presets_build_their_family(moe_dir):
    preset, path = moe_dir
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == {"qwen3-moe": "qwen3_moe", "mixtral": "mixtral"}[preset]
    assert config["num_experts_per_tok"] == 2


def test_make_tiny_refuses_another_family_for_a_moe_preset(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "m"), "--preset", "mixtral", "--family", "llama"]) == 2
    assert "mixtral model" in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_grpo_trains_resumes_with_aux_loss(moe_dir, tmp_path):
    """2 GRPO steps with the load-balancing loss on, then resumed to a third."""
    _, model = moe_dir
    _train(model, tmp_path, 2, "actor.router_aux_loss_coef=0.01")
    _train(model, tmp_path, 3, "actor.router_aux_loss_coef=0.01", "trainer.resume=auto")
    lines = _metrics(tmp_path)
    assert {r["step"] for r in lines} >= {1, 2, 3} and list_checkpoints(tmp_path)
    aux = [r["actor/router_aux_loss"] for r in lines if "actor/router_aux_loss" in r]
    assert aux and all(math.isfinite(a) and a > 0 for a in aux)


def test_grpo_lora_trains_attention_only_and_exports(moe_dir, tmp_path):
    _, model = moe_dir
    _train(model, tmp_path / "run", 2, *LORA)
    ckpt = list_checkpoints(tmp_path / "run")[-1]
    from safetensors import safe_open

    with safe_open(str(ckpt / "adapter_model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and all("self_attn" in n for n in names), names  # no adapter on the routers or experts
    assert main(["export", str(ckpt), str(tmp_path / "merged"), "--merge"]) == 0
    assert (tmp_path / "merged" / "config.json").is_file()


# --- the routers --------------------------------------------------------------------------

@pytest.fixture(scope="module", params=["qwen3-moe", "mixtral"])
def moe_model(request) -> torch.nn.Module:
    return build_tiny_model(request.param, vocab_size=260).eval()


def test_load_balancing_loss_matches_transformers(moe_model):
    ids = torch.randint(3, 250, (2, 9), generator=torch.Generator().manual_seed(0))
    with RouterWatch(moe_model) as w:
        out = moe_model(input_ids=ids, output_router_logits=True)
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    r = routers(moe_model)[0]
    want = load_balancing_loss_func(out.router_logits, r.num_experts, r.top_k)
    torch.testing.assert_close(load_balancing_loss(w), want, rtol=1e-5, atol=1e-6)


def test_replaying_the_models_own_routing_changes_nothing(moe_model):
    ids = torch.randint(3, 250, (2, 9), generator=torch.Generator().manual_seed(1))
    with RouterWatch(moe_model) as w:
        own = moe_model(input_ids=ids).logits
    with replay_routing(moe_model, [e[0] for e in w.experts]):
        replayed = moe_model(input_ids=ids).logits
    assert torch.equal(own, replayed)


def test_replay_routes_by_the_recorded_experts_and_differentiates_the_gate(moe_model):
    ids = torch.randint(3, 250, (1, 6), generator=torch.Generator().manual_seed(2))
    with RouterWatch(moe_model) as w:
        own = moe_model(input_ids=ids).logits
    other = [(e[0] + 1) % routers(moe_model)[0].num_experts for e in w.experts]  # a hand-made disagreement
    other[0][:2] = -1  # the first two tokens of layer 0 route freely
    with replay_routing(moe_model, other), RouterWatch(moe_model) as seen:
        replayed = moe_model(input_ids=ids).logits
        replayed.logsumexp(-1).sum().backward()
    for i, (want, got) in enumerate(zip(other, seen.experts)):
        free = (want < 0).all(-1)
        assert torch.equal(got[0][~free], want[~free]), i
        assert torch.equal(got[0][free], w.experts[i][0][free]), i
    assert not torch.allclose(own, replayed)
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers(moe_model))
    moe_model.zero_grad(set_to_none=True)
