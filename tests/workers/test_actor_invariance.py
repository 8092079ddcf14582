"""The actor's update does not depend on how a step's rows are split: 1 micro-batch of 8 vs
8 micro-batches of 1, and 1 rank vs 2 data-parallel Ray ranks, give the same gradient (its
norm before clipping, and the loss) and the same new weights.

The gradient norm is the sharp check: AdamW's first step is nearly scale-invariant, so a
normaliser off by a constant factor would leave the weights almost unchanged."""

import pytest
import torch
from safetensors.torch import load_file

from baton import fields as F
from baton.batch import Batch
from baton.config import load_config
from baton.controller import ResourcePool, WorkerGroup
from baton.models.make import make_tiny_checkpoint
from baton.trainers.ppo_config import PPOConfig
from baton.workers.actor import ActorWorker


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=1))


def rollout_batch(rows=8, P=5, R=6, vocab=50) -> Batch:
    g = torch.Generator().manual_seed(0)
    resp_mask = torch.ones(rows, R, dtype=torch.long)
    for i in range(rows):  # different response lengths, so the normalisers matter
        resp_mask[i, 1 + i % R:] = 0
    prompt_mask = torch.ones(rows, P, dtype=torch.long)
    prompt_mask[::2, :2] = 0  # some prompts left-padded
    logp = -torch.rand(rows, R, generator=g)
    return Batch({F.PROMPT_IDS: torch.randint(4, vocab, (rows, P), generator=g), F.PROMPT_MASK: prompt_mask,
                  F.RESPONSE_IDS: torch.randint(4, vocab, (rows, R), generator=g), F.RESPONSE_MASK: resp_mask,
                  F.OLD_LOGPROBS: logp, F.ADVANTAGES: torch.randn(rows, 1, generator=g).expand(rows, R).clone()})


def updated_weights(model_dir, tmp_path, backend, world_size, micro, agg):
    cfg = load_config(PPOConfig, overrides=[
        f"model.path={model_dir}", "model.dtype=float64", "data.prompts_per_step=2", "rollout.n=4", "actor.lr=1e-2",
        f"actor.micro_batch_size={micro}", f"algo.loss_agg={agg}", "rollout.max_new_tokens=6",
        f"placement.backend={backend}", f"placement.world_size={world_size}", "actor.grad_clip=1e9"])
    group = WorkerGroup(ResourcePool(world_size, backend=backend), ActorWorker, cfg.model, cfg.actor, cfg.algo,
                        temperature=1.0, max_new_tokens=6, total_steps=1, seed=0)
    try:
        metrics = group.update(rollout_batch())
        out = tmp_path / f"{backend}{world_size}-{micro}-{agg}"
        group.save_checkpoint(str(out), {})
    finally:
        group.shutdown()
    return load_file(str(out / "model.safetensors")), metrics[0]


def assert_same(a, b, lr=1e-2):
    # Compared in float64 (the model is built in float64), so the splits differ only by
    # float64 summation order (~1e-15 of the gradient; AVX2 and AVX-512 kernels sum in
    # different orders). Adam's first step moves a weight by lr * g / (|g| + eps), which turns
    # a gradient difference d into at most lr * d / eps (eps = 1e-8): lr * 1e-6 allows
    # d <= 1e-14. The reported grad norm of a sharded strategy is a float32 sum (rel 1e-6).
    (wa, ma), (wb, mb) = a, b
    assert ma["actor/grad_norm"] == pytest.approx(mb["actor/grad_norm"], rel=1e-6)
    assert ma["actor/loss"] == pytest.approx(mb["actor/loss"], rel=1e-9, abs=1e-12)
    assert wa.keys() == wb.keys()
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst < lr * 1e-6, worst


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_do_not_change_the_update(model_dir, tmp_path, agg):
    one = updated_weights(model_dir, tmp_path, "local", 1, micro=8, agg=agg)
    eight = updated_weights(model_dir, tmp_path, "local", 1, micro=1, agg=agg)
    assert_same(one, eight)
    before = load_file(f"{model_dir}/model.safetensors")
    assert max((one[0][k] - before[k]).abs().max().item() for k in before) > 1e-3  # it did train


@pytest.mark.ray  # the session's Ray instance (tests/conftest.py)
def test_two_data_parallel_ranks_equal_one(model_dir, tmp_path):
    one = updated_weights(model_dir, tmp_path, "local", 1, micro=8, agg="token-mean")
    two = updated_weights(model_dir, tmp_path, "ray", 2, micro=2, agg="token-mean")
    assert_same(one, two)
