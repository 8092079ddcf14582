"""The DPO actor's preference step: it moves the right way, it does not depend on how the
pairs are split (micro-batches, data-parallel Ray ranks, padding pairs), and the reference
can take the policy's weights (the every-K-steps refresh).

Direction is the sharp check of the sign: one step must raise each pair's chosen sequence
logprob relative to its rejected one (swapping chosen and rejected anywhere on the way to
the loss makes it fail). Invariance compares the gradient norm before clipping (AdamW's
first step is nearly scale-invariant, so a normaliser off by a constant would leave the
weights almost unchanged) and the new weights."""

import pytest
import torch
from safetensors.torch import load_file

from baton import fields as F
from baton.algos.dpo_config import DPOLossConfig
from baton.batch import Batch
from baton.controller import ResourcePool, WorkerGroup
from baton.models.config import ModelConfig
from baton.models.make import make_tiny_checkpoint
from baton.workers.actor import ActorConfig
from baton.workers.dpo_actor import PAIR_PAD, DPOActorWorker, pair_rows
from baton.workers.reference import ReferenceWorker


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=1))


def sampled_rows(prompts=4, n=3, P=5, R=6, vocab=50, seed=0) -> Batch:
    """Rows prompt-major (n per prompt), responses of different lengths, some prompts padded."""
    g = torch.Generator().manual_seed(seed)
    rows = prompts * n
    prompt_ids = torch.randint(4, vocab, (prompts, P), generator=g).repeat_interleave(n, 0)
    prompt_mask = torch.ones(rows, P, dtype=torch.long)
    prompt_mask[: 2 * n, :2] = 0  # the first two prompts left-padded
    resp_mask = torch.ones(rows, R, dtype=torch.long)
    for i in range(rows):
        resp_mask[i, 1 + (i * 5) % R:] = 0
    return Batch({F.PROMPT_IDS: prompt_ids, F.PROMPT_MASK: prompt_mask,
                  F.RESPONSE_IDS: torch.randint(4, vocab, (rows, R), generator=g), F.RESPONSE_MASK: resp_mask})


def pairs_of(rows: Batch, n=3) -> tuple[torch.Tensor, torch.Tensor]:
    """n = 3: pair i is sample 0 of prompt i (chosen) vs sample 1 (rejected), then sample 2
    vs 1 (8 pairs for 4 prompts); n = 2: sample 0 vs 1 of each prompt."""
    base = torch.arange(len(rows) // n) * n
    if n == 2:
        return base, base + 1
    return torch.cat([base, base + 2]), torch.cat([base + 1, base + 1])


def invariance_pairs(multiple=1) -> Batch:
    """8 pairs, one prompt each: every split (whole, per pair, per rank) shares each prompt's
    forward across the same two rows. (Two pairs of one prompt would share it across four
    rows in one split and two in another; transformers' RMSNorm computes in float32 even in
    a float64 model, so the prompt's gradient would round differently: noise of ~1e-7 of
    the gradient, which Adam's first step turns into up to lr on a near-zero gradient.)"""
    rows = sampled_rows(prompts=8, n=2)
    return with_ref(pair_rows(rows, *pairs_of(rows, n=2), multiple=multiple))


def with_ref(batch: Batch, seed=1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    batch[F.REF_LOGPROBS] = -torch.rand(batch[F.RESPONSE_IDS].shape, generator=g) * batch[F.RESPONSE_MASK]
    return batch


def actor_group(model_dir, backend="local", world_size=1, micro=16, mini=0, lr=1e-3, **dpo):
    return WorkerGroup(ResourcePool(world_size, backend=backend), DPOActorWorker,
                       ModelConfig(path=model_dir, dtype="float64"),
                       ActorConfig(lr=lr, micro_batch_size=micro, mini_batch_size=mini, grad_clip=1e9),
                       DPOLossConfig(**dpo), temperature=1.0, max_new_tokens=6, total_steps=1, seed=0)


def update_and_weights(model_dir, out, batch, **kw):
    group = actor_group(model_dir, **kw)
    try:
        metrics = group.update_dpo(batch)
        group.save_checkpoint(str(out), {})
    finally:
        group.shutdown()
    return load_file(str(out / "model.safetensors")), metrics


def assert_same(a, b, lr=1e-3):
    (wa, ma), (wb, mb) = a, b
    for m in mb:  # every rank reports the same global means
        assert m == pytest.approx(mb[0], rel=1e-9)
    ma, mb = ma[0], mb[0]
    # Compared in float64 (the model is built in float64), so the splits differ only by
    # float64 summation order (~1e-15 of the gradient; AVX2 and AVX-512 kernels sum in
    # different orders). Adam's first step moves a weight by lr * g / (|g| + eps), which turns
    # a gradient difference d into at most lr * d / eps (eps = 1e-8): lr * 1e-6 allows
    # d <= 1e-14. The reported grad norm of a sharded strategy is a float32 sum (rel 1e-6).
    assert ma["actor/grad_norm"] == pytest.approx(mb["actor/grad_norm"], rel=1e-6)
    assert ma.keys() == mb.keys()
    for k in ("actor/loss", "rewards/margins", "rewards/accuracies", "logps/chosen", "dpo/kl", "dpo/nll"):
        if k in ma:
            assert ma[k] == pytest.approx(mb[k], rel=1e-9, abs=1e-12), k
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst < lr * 1e-6, worst


def test_pair_rows_lays_out_pairs_and_flags_padding():
    rows = sampled_rows()
    chosen, rejected = torch.tensor([0, 3, 6]), torch.tensor([1, 5, 7])
    batch = pair_rows(rows, chosen, rejected, multiple=2)  # 3 pairs -> 4: one padding pair
    assert len(batch) == 8
    order = torch.tensor([0, 1, 3, 5, 6, 7, 0, 1])
    assert torch.equal(batch[F.RESPONSE_IDS], rows[F.RESPONSE_IDS][order])
    assert batch[PAIR_PAD].tolist() == [False] * 6 + [True] * 2
    with pytest.raises(ValueError, match="at least one pair"):
        pair_rows(rows, chosen[:0], rejected[:0])


def test_one_step_raises_chosen_over_rejected(model_dir):
    rows = sampled_rows()
    chosen, rejected = pairs_of(rows)
    batch = pair_rows(rows, chosen, rejected)
    group = actor_group(model_dir, reference_free=True)
    seq = lambda: (group.compute_logprobs(batch).get()[F.OLD_LOGPROBS] * batch[F.RESPONSE_MASK]).sum(-1)  # [2P]
    try:
        before = seq()
        metrics = group.update_dpo(batch)[0]
        after = seq()
    finally:
        group.shutdown()
    gain = (after - before)[0::2] - (after - before)[1::2]  # [P]: chosen's rise minus rejected's
    assert (gain > 0).all(), gain
    assert metrics["logps/chosen"] == pytest.approx(before[0::2].mean().item(), rel=1e-5)
    assert "dpo/kl" not in metrics  # reference-free: no KL to report


@pytest.mark.parametrize("dpo", [dict(loss="sigmoid"), dict(loss="ipo"), dict(loss="hinge"),
                                 dict(loss="sigmoid", label_smoothing=0.1, nll_coef=1.0)])
def test_micro_batches_do_not_change_the_update(model_dir, tmp_path, dpo):
    batch = invariance_pairs()  # 8 pairs, 16 rows
    kw = dict(beta=0.5, **dpo)
    whole = update_and_weights(model_dir, tmp_path / "whole", batch, micro=16, **kw)
    pairwise = update_and_weights(model_dir, tmp_path / "pairwise", batch, micro=2, **kw)
    assert_same(whole, pairwise)
    before = load_file(f"{model_dir}/model.safetensors")
    assert max((whole[0][k] - before[k]).abs().max().item() for k in before) > 5e-4  # it did train


def test_padding_pairs_carry_no_loss(model_dir, tmp_path):
    rows = sampled_rows(prompts=8, n=2)
    chosen, rejected = pairs_of(rows, n=2)
    plain = with_ref(pair_rows(rows, chosen[:7], rejected[:7]))  # 7 pairs
    padded = with_ref(pair_rows(rows, chosen[:7], rejected[:7], multiple=4))  # + 1 padding pair
    plain[F.REF_LOGPROBS] = padded[F.REF_LOGPROBS][:14]
    assert padded[PAIR_PAD].sum() == 2
    assert_same(update_and_weights(model_dir, tmp_path / "plain", plain, micro=4),
                update_and_weights(model_dir, tmp_path / "padded", padded, micro=4))


def test_a_batch_that_would_split_a_pair_is_refused(model_dir):
    rows = sampled_rows()
    batch = with_ref(pair_rows(rows, *pairs_of(rows)))
    group = actor_group(model_dir)
    try:
        with pytest.raises(Exception, match="split"):
            group.update_dpo(batch.rows(torch.arange(15)))  # 15 rows: half a pair at the end
    finally:
        group.shutdown()


def test_reference_takes_the_actor_weights(model_dir):
    """The refresh: after load_weights(actor.get_weights()), reference logprobs equal the
    actor's own (and before it, after an update, they differ)."""
    rows = sampled_rows()
    batch = with_ref(pair_rows(rows, *pairs_of(rows)))
    pool = ResourcePool(1)
    actor = WorkerGroup(pool, DPOActorWorker, ModelConfig(path=model_dir),
                        ActorConfig(lr=1e-2, micro_batch_size=16), DPOLossConfig(),
                        temperature=1.0, max_new_tokens=6, total_steps=1, seed=0)
    ref = WorkerGroup(pool, ReferenceWorker, ModelConfig(path=model_dir), temperature=1.0, micro_batch_size=16)
    try:
        actor.update_dpo(batch)
        mine = actor.compute_logprobs(batch).get()[F.OLD_LOGPROBS]
        stale = ref.compute_ref_logprobs(batch).get()[F.REF_LOGPROBS]
        assert (mine - stale).abs().max() > 1e-3
        ref.load_weights(actor.get_weights())
        fresh = ref.compute_ref_logprobs(batch).get()[F.REF_LOGPROBS]
        assert torch.allclose(mine, fresh, atol=1e-6)
        weights = ref.get_weights()
        actor.update_dpo(batch)  # the copy is a copy: the actor's next step leaves it alone
        assert all(torch.equal(weights[k], v) for k, v in ref.get_weights().items())
    finally:
        ref.shutdown()
        actor.shutdown()


@pytest.mark.slow  # ~9 s on Ray; default run: the in-process micro-batch invariance above, and the
# GRPO actor's two Ray ranks (tests/workers/test_actor_invariance.py) for the data-parallel reduction
@pytest.mark.ray
def test_two_data_parallel_ranks_equal_one(model_dir, tmp_path):
    """1 rank x 8 pairs == 2 Ray ranks x 4 pairs (micro-batches of 1 pair per rank)."""
    batch = invariance_pairs(multiple=2)
    one = update_and_weights(model_dir, tmp_path / "one", batch, micro=16)
    two = update_and_weights(model_dir, tmp_path / "two", batch, backend="ray", world_size=2, micro=4)
    assert_same(one, two)
