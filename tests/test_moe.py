"""Mixture-of-experts models (issue 54): the tiny Qwen3-MoE and Mixtral presets train, resume and
export; the routers' load-balancing loss; routing replay (baton.models.moe)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from baton import fields as F
from baton.batch import Batch
from baton.cli import main
from baton.models.moe import RouterWatch, check_routing, load_balancing_loss, replay_routing, routers
from baton.models.tiny import build_tiny_model
from baton.runs.checkpoints import list_checkpoints
from baton.workers.sequences import response_logprobs

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


# --- routing replay (rollout.routing_replay) ------------------------------------------------

PROMPTS = [[5, 6, 7, 8, 9], [10, 11]]


def _engine_rows(model: torch.nn.Module) -> tuple[list, Batch]:
    """The engine's completions (recording their experts) and their training rows."""
    from baton.models.tokenizer import build_char_tokenizer
    from baton.protocol import SamplingParams
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.workers.rollout import completions_to_batch

    engine = EmbeddedEngine(model, record_routing=True, pad_token_id=0, eos_token_ids=[2])
    done = engine.generate(PROMPTS, SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=0))
    prompts = Batch.from_dict({F.PROMPT_TEXT: ["a", "b"]})
    return done, completions_to_batch(prompts, PROMPTS, done, 0, build_char_tokenizer())


def test_the_engine_records_the_experts_hf_routes_each_token_by(moe_model):
    done, rows = _engine_rows(moe_model)
    for c in done:
        prompt = PROMPTS[c.prompt_index]
        with torch.no_grad(), RouterWatch(moe_model) as w:
            moe_model(input_ids=torch.tensor([prompt + c.token_ids]))
        P, R = len(prompt), len(c.token_ids)
        hf = torch.stack([e[0][P - 1:P + R - 1] for e in w.experts], 1)  # [R, layers, K]
        assert torch.equal(hf.sort(-1).values, c.routing.sort(-1).values)
    assert rows[F.ROUTING].shape[:2] == rows[F.RESPONSE_IDS].shape and rows[F.ROUTING].dtype == torch.long


def test_replay_changes_nothing_when_engine_and_trainer_agree(moe_model):
    _, rows = _engine_rows(moe_model)
    tally: dict = {}
    with torch.no_grad():
        replayed, _ = response_logprobs(moe_model, rows, tally=tally)
        plain, _ = response_logprobs(moe_model, Batch({k: v for k, v in rows.tensors.items() if k != F.ROUTING}),
                                     share_prompts=False)
    assert torch.equal(replayed, plain)
    assert tally["routing_replayed"] > 0 and tally["routing_differ"] == 0


def test_a_disagreement_is_routed_by_the_recorded_experts(moe_model):
    _, rows = _engine_rows(moe_model)
    E = routers(moe_model)[0].num_experts
    routing = rows[F.ROUTING].clone()
    routing[0, 0, 0] = (routing[0, 0, 0] + 1) % E  # row 0's first token, layer 0: other experts
    rows[F.ROUTING] = routing
    tally: dict = {}
    with torch.no_grad():
        replayed, _ = response_logprobs(moe_model, rows, tally=tally)
        plain, _ = response_logprobs(moe_model, Batch({k: v for k, v in rows.tensors.items() if k != F.ROUTING}),
                                     share_prompts=False)
        P = rows[F.PROMPT_IDS].shape[1]
        want = [None] * len(routers(moe_model))  # by hand: row 0's position P - 1 in layer 0 sent elsewhere
        ids = torch.cat([rows[F.PROMPT_IDS][:1], rows[F.RESPONSE_IDS][:1]], 1)
        with RouterWatch(moe_model) as w:
            moe_model(input_ids=ids, attention_mask=torch.cat([rows[F.PROMPT_MASK][:1], rows[F.RESPONSE_MASK][:1]], 1))
        forced = torch.full_like(w.experts[0][0], -1)
        forced[P - 1] = routing[0, 0, 0]
        want[0] = forced
    assert tally["routing_differ"] == 1
    assert not torch.equal(replayed[0, 0], plain[0, 0]) and torch.equal(replayed[1:], plain[1:])
    with torch.no_grad(), replay_routing(moe_model, want), RouterWatch(moe_model) as seen:
        moe_model(input_ids=ids, attention_mask=torch.cat([rows[F.PROMPT_MASK][:1], rows[F.RESPONSE_MASK][:1]], 1))
    assert torch.equal(seen.experts[0][0][P - 1], routing[0, 0, 0])


@pytest.mark.parametrize("change, words", [
    (lambda r: r[:, :, :1], "1 MoE layers x top-2; the model routes 2 layers"),  # another layer count
    (lambda r: r.index_fill(0, torch.tensor([2]), 7), "row 2: recorded expert 7"),  # an expert out of range
])
def test_recorded_experts_that_do_not_fit_are_refused_naming_the_row(moe_model, change, words):
    _, rows = _engine_rows(moe_model)
    with pytest.raises(ValueError, match=words.replace("(", r"\(")) as err:
        check_routing(change(rows[F.ROUTING]), moe_model)
    assert "\n" not in str(err.value)


def test_grpo_with_replay_trains_as_without_when_engine_and_trainer_agree(moe_dir, tmp_path):
    """fp32 engine and trainer route alike: replay leaves every metric of the first steps as it
    was (and reports no routing mismatch). Up to rounding: the replayed forward runs whole rows,
    not a shared prompt pass then the responses (measured 1e-7 relative on the entropy)."""
    _, model = moe_dir
    _train(model, tmp_path / "plain", 2)
    _train(model, tmp_path / "replay", 2, "rollout.routing_replay=true")
    plain, replay = [[r for r in _metrics(tmp_path / run) if "actor/loss" in r] for run in ("plain", "replay")]
    keys = [k for k in plain[0] if k.startswith(("actor/", "reward/")) or k == "rollout/logprob_mismatch_kl"]
    assert keys and all(r.get("rollout/routing_mismatch") == 0.0 for r in replay)
    assert len(plain) == len(replay) == 2
    for a, b in zip(plain, replay):
        for k in keys:
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7), k


@pytest.mark.parametrize("overrides, words", [
    (["data.source=api"], "rows from data.source=api arrive without them"),
    (["actor.activation_checkpointing=true"], "actor.activation_checkpointing"),
])
def test_routing_replay_refuses_what_it_cannot_serve(moe_dir, overrides, words, tmp_path, capsys):
    code = main(["train", "recipes/grpo_arithmetic.yaml", f"model.path={moe_dir[1]}", *RL, "rollout.routing_replay=true",
                 *overrides,
                 f"trainer.run_dir={tmp_path / 'run'}"])
    assert code == 2 and words in capsys.readouterr().err and not (tmp_path / "run").exists()


DPO = ["data.prompts_per_step=2", "rollout.n=2", "data.eval_size=2", "actor.micro_batch_size=4", "trainer.progress=false"]
OTHER_ROWS = {  # the recipe matrix's other non-Ray rows (tests/test_recipe_matrix.py), on the MoE
    "ppo-critic": ["recipes/ppo_arithmetic.yaml", *RL, "critic.mini_batch_size=0", "critic.micro_batch_size=4",
                   "critic.pretrain_steps=1"],
    "distill": ["recipes/distill_arithmetic.yaml", *RL],
    "online-dpo": ["recipes/online_dpo_arithmetic.yaml", *DPO],
    "offline-dpo": ["recipes/offline_dpo_arithmetic.yaml", "data.path=tests/fixtures/pairs.jsonl", "data.pairs_per_step=4",
                    "data.eval_size=2", "actor.micro_batch_size=4", "trainer.progress=false"],
    "agent-calculator": ["recipes/agent_calculator.yaml", *RL, "agent.max_turns=2"],
    "grpo-fsdp2": ["recipes/grpo_arithmetic.yaml", *RL, "actor.strategy=fsdp2"],
}


@pytest.mark.slow  # ~75 s for the 12; the dense rows of the recipe matrix run these paths by default
@pytest.mark.parametrize("row", list(OTHER_ROWS))
def test_the_other_recipes_train_a_moe(moe_dir, row, tmp_path):
    """2 steps of each; the Ray rows (data-parallel, one-step-off, with routing replay) were run
    by hand (docs/MOE.md)."""
    _, model = moe_dir
    recipe, *overrides = OTHER_ROWS[row]
    assert main(["train", recipe, f"model.path={model}", *overrides, f"trainer.run_dir={tmp_path}",
                 "trainer.steps=2"]) == 0
    assert {r["step"] for r in _metrics(tmp_path)} >= {1, 2}


@pytest.mark.parametrize("key", ["actor.router_aux_loss_coef=0.01", "rollout.routing_replay=true"])
def test_moe_keys_on_a_dense_model_are_refused_before_the_run_dir(key, tmp_path, capsys):
    code = main(["train", "recipes/grpo_arithmetic.yaml", *RL, key, f"trainer.run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a mixture of experts" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_sft_builds_a_moe_preset_and_refuses_another_family_for_it(tmp_path, capsys):
    sft = ["sft", "recipes/sft_arithmetic.yaml", "model.preset=qwen3-moe", "data.num_examples=16",
           "trainer.batch_size=4", "data.eval_size=2", "trainer.steps=2"]
    assert main([*sft, "model.family=null", f"trainer.run_dir={tmp_path / 'run'}"]) == 0
    config = json.loads(next((tmp_path / "run" / "checkpoints").glob("*/config.json")).read_text())
    assert config["model_type"] == "qwen3_moe"
    capsys.readouterr()
    assert main([*sft, "model.family=llama", f"trainer.run_dir={tmp_path / 'other'}"]) == 2  # the recipe's qwen2 too
    assert "model.family=llama would be ignored" in capsys.readouterr().err and not (tmp_path / "other").exists()
