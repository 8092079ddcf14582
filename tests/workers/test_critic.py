"""The critic role on a tiny random model: which hidden state a token's value comes from,
loading a reward model's trained head, the update's invariance to how a step's rows are split
(1 micro-batch of 8 = 8 of 1 = 2 Ray ranks x 4), exact clip fraction, and checkpoint resume."""

import pytest
import torch
from safetensors.torch import load_file

from baton import fields as F
from baton.batch import Batch
from baton.controller import ResourcePool, WorkerGroup
from baton.models.config import ModelConfig
from baton.models.make import make_tiny_checkpoint
from baton.workers.critic import CriticConfig, CriticWorker, load_value_model, prefix_values
from baton.workers.reward_model import load_reward_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=1))


def rollout_batch(rows=8, P=5, R=6, vocab=50, seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    resp_mask = torch.ones(rows, R, dtype=torch.long)
    for i in range(rows):  # different response lengths, so the normalisers matter
        resp_mask[i, 1 + i % R:] = 0
    prompt_mask = torch.ones(rows, P, dtype=torch.long)
    prompt_mask[::2, :2] = 0  # some prompts left-padded
    return Batch({F.PROMPT_IDS: torch.randint(4, vocab, (rows, P), generator=g), F.PROMPT_MASK: prompt_mask,
                  F.RESPONSE_IDS: torch.randint(4, vocab, (rows, R), generator=g), F.RESPONSE_MASK: resp_mask,
                  F.VALUES: 0.1 * torch.randn(rows, R, generator=g) * resp_mask,
                  F.RETURNS: torch.rand(rows, R, generator=g) * resp_mask})


def critic_group(model_dir, backend="local", world_size=1, **cfg):
    c = CriticConfig(**{"lr": 1e-2, "grad_clip": 1e9, **cfg})
    return WorkerGroup(ResourcePool(world_size, backend=backend), CriticWorker, c,
                       ModelConfig(path=model_dir, dtype="float64"),
                       total_steps=4, seed=0, max_new_tokens=6)


def test_value_of_token_t_is_the_prefix_before_it(model_dir):
    """V[i, t] = head(hidden state of the last token of prompt_i + response_i[:t]): computed
    here by a separate forward of each unpadded prefix alone."""
    model = load_value_model(model_dir)
    batch = rollout_batch(rows=3)
    with torch.no_grad():
        values = prefix_values(model, batch)  # [3, R]
        for i in range(3):
            prompt = batch[F.PROMPT_IDS][i][batch[F.PROMPT_MASK][i].bool()]
            n = int(batch[F.RESPONSE_MASK][i].sum())
            for t in range(n):
                ids = torch.cat([prompt, batch[F.RESPONSE_IDS][i, :t]])[None]
                expect = model(input_ids=ids).logits[0, -1, 0]
                assert values[i, t].item() == pytest.approx(expect.item(), abs=1e-5)
            assert (values[i, n:] == 0).all()  # padding


def test_shared_prompt_forward_equals_the_full_forward(model_dir):
    """Rows in groups of 4 samples per prompt: computing each prompt once (its KV cache
    gathered to the group) gives the values and gradients of one full forward per row."""
    model = load_value_model(model_dir, torch.float64)  # float64: see test_sequences.py
    batch = rollout_batch(rows=8)
    for k in (F.PROMPT_IDS, F.PROMPT_MASK):  # 2 prompts x 4 samples
        batch[k] = batch[k][[0, 0, 0, 0, 1, 1, 1, 1]]
    grads = []
    for share in (True, False):
        model.zero_grad()
        values = prefix_values(model, batch, share_prompts=share)
        (values * torch.linspace(-1, 1, values.numel()).view_as(values)).sum().backward()
        grads.append(([p.grad.clone() for p in model.parameters()], values.detach()))
    (g_shared, v_shared), (g_full, v_full) = grads
    assert torch.allclose(v_shared, v_full, atol=1e-12, rtol=0)
    for a, b in zip(g_shared, g_full):  # bound: tests/workers/test_sequences.py
        torch.testing.assert_close(a, b, atol=1e-6 * b.abs().max().item(), rtol=0)


def test_head_is_seeded_and_a_reward_models_head_is_loaded(model_dir, tmp_path):
    a, b = load_value_model(model_dir, seed=3), load_value_model(model_dir, seed=3)
    assert torch.equal(a.score.weight, b.score.weight)  # every rank builds the same new head
    assert not torch.equal(a.score.weight, load_value_model(model_dir, seed=4).score.weight)
    rm = load_reward_model(model_dir, seed=7)
    with torch.no_grad():
        rm.score.weight.normal_()
    rm.save_pretrained(tmp_path / "rm")
    critic = load_value_model(str(tmp_path / "rm"), seed=0)
    assert torch.equal(critic.score.weight, rm.score.weight) and critic.score.bias is None


def updated(model_dir, tmp_path, backend, world_size, micro, **cfg):
    group = critic_group(model_dir, backend, world_size, micro_batch_size=micro, **cfg)
    try:
        metrics = group.update_critic(rollout_batch()).get()
        out = tmp_path / f"{backend}{world_size}-{micro}"
        group.save_checkpoint(str(out))
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
    assert ma["critic/grad_norm"] == pytest.approx(mb["critic/grad_norm"], rel=1e-6)
    # each micro-batch's clip fraction is a float32 ratio of token counts (masked_mean of a bool)
    assert ma["critic/vf_clipfrac"] == pytest.approx(mb["critic/vf_clipfrac"], rel=1e-6)
    for k in ("critic/vf_loss", "critic/value_mean"):
        assert ma[k] == pytest.approx(mb[k], rel=1e-9, abs=1e-12), k
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst < lr * 1e-6, worst


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_do_not_change_the_update(model_dir, tmp_path, agg):
    one = updated(model_dir, tmp_path, "local", 1, micro=8, loss_agg=agg)
    eight = updated(model_dir, tmp_path, "local", 1, micro=1, loss_agg=agg)
    assert_same(one, eight)
    assert 0 < one[1]["critic/vf_clipfrac"] < 1  # the clipped branch is exercised
    before = load_file(f"{model_dir}/model.safetensors")
    assert max((one[0][k] - before[k]).abs().max().item() for k in before if k in one[0]) > 1e-3


@pytest.mark.slow  # ~9 s on Ray; default run: the in-process micro-batch invariance above, and the
# GRPO actor's two Ray ranks (tests/workers/test_actor_invariance.py) for the data-parallel reduction
@pytest.mark.ray  # the session's Ray instance (tests/conftest.py)
def test_two_data_parallel_ranks_equal_one(model_dir, tmp_path):
    one = updated(model_dir, tmp_path, "local", 1, micro=8)
    two = updated(model_dir, tmp_path, "ray", 2, micro=8)  # 2 ranks x 4 rows
    assert_same(one, two)


def test_fsdp2_gives_the_ddp_update(model_dir, tmp_path):
    """critic.strategy=fsdp2 on a 1-rank mesh (DTensor parameters, the model's own forward
    instead of the shared-prompt pass): the same update, an HF checkpoint gathered from it."""
    ddp = updated(model_dir, tmp_path / "ddp", "local", 1, micro=8)
    fsdp = updated(model_dir, tmp_path / "fsdp", "local", 1, micro=8, strategy="fsdp2")
    assert_same(ddp, fsdp)


@pytest.mark.ray
@pytest.mark.slow  # two Ray pools of 2 ranks
@pytest.mark.parametrize("strategy,mesh", [("fsdp2", None), ("ddp", {"tp": 2})])
def test_sharded_critic_on_two_ranks_equals_one(model_dir, tmp_path, strategy, mesh):
    one = updated(model_dir, tmp_path / "one", "local", 1, micro=8, lr=1e-3)
    c = CriticConfig(lr=1e-3, grad_clip=1e9, micro_batch_size=8, strategy=strategy)
    group = WorkerGroup(ResourcePool(2, backend="ray", mesh=mesh), CriticWorker, c,
                        ModelConfig(path=model_dir, dtype="float64"),
                        total_steps=4, seed=0, max_new_tokens=6)
    try:
        metrics = group.update_critic(rollout_batch()).get()
        group.save_checkpoint(str(tmp_path / "two"))
    finally:
        group.shutdown()
    assert_same(one, (load_file(str(tmp_path / "two" / "model.safetensors")), metrics[0]), lr=1e-3)


def test_clip_fraction_is_exact_and_zero_without_clipping(model_dir):
    """Unclipped (value_clip=None): no token counts as clipped. With V_old = V (values from the
    critic itself) nothing is clipped on the first pass either: the fraction is exactly 0."""
    batch = rollout_batch()
    g = critic_group(model_dir, value_clip=None)
    try:
        assert g.update_critic(batch).get()[0]["critic/vf_clipfrac"] == 0.0
    finally:
        g.shutdown()
    g = critic_group(model_dir, value_clip=0.2, mini_batch_size=8)
    try:
        batch[F.VALUES] = g.compute_values(batch).get()[F.VALUES]
        assert g.update_critic(batch).get()[0]["critic/vf_clipfrac"] == 0.0
    finally:
        g.shutdown()


def test_fitting_lowers_the_loss_and_a_checkpoint_resumes_exactly(model_dir, tmp_path):
    batch = rollout_batch()
    g = critic_group(model_dir, lr=1e-4, value_clip=None)
    try:
        losses = [g.update_critic(batch).get()[0]["critic/vf_loss"] for _ in range(3)]
        assert losses[-1] < losses[0]
        g.save_checkpoint(str(tmp_path / "ck"))
        after_save = g.update_critic(batch).get()[0]
        values = g.compute_values(batch).get()[F.VALUES]
    finally:
        g.shutdown()
    h = critic_group(model_dir, lr=1e-4, value_clip=None)
    try:
        h.load_checkpoint(str(tmp_path / "ck"))
        resumed = h.update_critic(batch).get()[0]  # same weights, Adam moments, schedule, shuffle
        assert resumed == after_save
        assert torch.equal(h.compute_values(batch).get()[F.VALUES], values)
    finally:
        h.shutdown()


def test_a_non_finite_loss_skips_the_optimizer_step(model_dir, tmp_path):
    batch = rollout_batch()
    batch[F.RETURNS] = torch.full_like(batch[F.RETURNS], float("nan"))
    g = critic_group(model_dir)
    try:
        before = g.compute_values(batch).get()[F.VALUES]
        m = g.update_critic(batch).get()[0]
        assert m["critic/nonfinite_skipped"] == 1.0 and m["critic/vf_loss"] != m["critic/vf_loss"]  # NaN
        assert torch.equal(g.compute_values(batch).get()[F.VALUES], before)  # weights untouched
    finally:
        g.shutdown()
