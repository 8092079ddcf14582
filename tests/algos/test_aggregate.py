"""Loss aggregation: hand-worked values, and gradient invariance to how the batch is split
(1 micro-batch of 8 == 8 of 1 == 2 simulated DP ranks x 2 micro-batches of 2), for every
mode, the abs KL estimator, GSPO and truncated-IS weights."""

import pytest
import torch

from baton.algos import actor_loss, aggregate_loss, entropy_from_logits, \
    logprobs_from_logits, loss_normalisers

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, float("nan")]])  # padding holds garbage
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_hand_worked():
    # token-mean: (1 + 2 + 3 + 4) / 4 = 2.5;  with 8 global tokens: 10 / 8 = 1.25
    assert aggregate_loss(LOSS, MASK, "token-mean").item() == 2.5
    assert aggregate_loss(LOSS, MASK, "token-mean", global_tokens=8).item() == 1.25
    # seq-mean-token-mean: (6/3 + 4/1) / 2 = 3;  with 4 global sequences: 6 / 4 = 1.5
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean").item() == 3.0
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean", global_seqs=4).item() == 1.5
    # seq-mean-token-sum: (6 + 4) / 2 = 5;  with 4 global sequences: 10 / 4 = 2.5
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum").item() == 5.0
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum", global_seqs=4).item() == 2.5
    # seq-mean-token-sum-norm, max_len 4: (6/4 + 4/4) / 2 = 1.25
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", max_len=4).item() == 1.25
    with pytest.raises(ValueError, match="max_len"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm")
    with pytest.raises(KeyError):
        aggregate_loss(LOSS, MASK, "token-mena")


def test_empty_rows_are_not_sequences():
    # a padding row (all-zero mask, as Batch.chunk adds) changes no mode
    loss = torch.cat([LOSS, torch.full((1, 3), 7.0)])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    assert [int(n) for n in loss_normalisers(mask)] == [4, 2]
    for mode in MODES:
        assert aggregate_loss(loss, mask, mode, max_len=4) == aggregate_loss(LOSS, MASK, mode, max_len=4)


# --- invariance ------------------------------------------------------------------------
LENGTHS = [3, 7, 1, 5, 8, 2, 6, 4]  # 8 sequences of different lengths
H, V, R, MAX_LEN = 4, 5, 8, 10


def make_data():
    g = torch.Generator().manual_seed(0)
    B = len(LENGTHS)
    x = torch.randn(B, R, H, generator=g)  # [B, R, H] features of a tiny "policy"
    labels = torch.randint(0, V, (B, R), generator=g)  # [B, R]
    mask = (torch.arange(R) < torch.tensor(LENGTHS)[:, None]).long()  # [B, R]
    w0 = torch.randn(H, V, generator=g)  # [H, V]
    old = logprobs_from_logits(x @ w0, labels) + 0.3 * torch.randn(B, R, generator=g)  # ratios != 1
    ref = logprobs_from_logits(x @ w0, labels) + 0.3 * torch.randn(B, R, generator=g)
    adv = torch.randn(B, R, generator=g)  # [B, R]
    tis = 0.5 + 1.5 * torch.rand(B, R, generator=g)  # [B, R] truncated-IS weights in [0.5, 2]
    return dict(x=x, labels=labels, mask=mask, old=old, ref=ref, adv=adv, tis=tis), w0


def grad_of(data, w0, rows, mode, tokens, seqs, max_len, kl="k3", loss="ppo_clip", tis=False):
    """Gradient of one micro-batch's loss, with the micro-batch re-padded to its own longest row."""
    rows = torch.tensor(rows)
    width = int(data["mask"][rows].sum(-1).max())  # micro-batch padded width differs per split
    d = {k: v[rows, :width] for k, v in data.items()}
    w = w0.clone().requires_grad_()
    logits = d["x"] @ w  # [b, r, V]
    loss, _ = actor_loss(
        logprobs=logprobs_from_logits(logits, d["labels"]), old_logprobs=d["old"],
        advantages=d["adv"] * d["tis"] if tis else d["adv"], response_mask=d["mask"], ref_logprobs=d["ref"],
        entropy=entropy_from_logits(logits), policy_loss=loss,
        policy_loss_kwargs=(dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0) if loss == "ppo_clip"
                            else dict(clip_low=0.05, clip_high=0.05)),
        kl_estimator=kl, kl_coef=0.1, entropy_coef=0.01, agg_mode=mode, global_tokens=tokens,
        global_seqs=seqs, max_len=max_len)  # tis: truncated-IS weights on the advantages, as the driver puts them
    loss.backward()
    return w.grad


CASES = [(mode, "k3", "ppo_clip", False) for mode in MODES] + [
    ("token-mean", "abs", "ppo_clip", False), ("seq-mean-token-sum", "abs", "ppo_clip", True),
    ("seq-mean-token-mean", "k3", "gspo", True), ("token-mean", "k1", "ppo_clip", True)]


@pytest.mark.parametrize("mode,kl,loss,tis", CASES)
def test_gradient_invariant_to_micro_batching_and_dp(mode, kl, loss, tis):
    data, w0 = make_data()
    tokens, seqs = loss_normalisers(data["mask"])  # over the whole mini-batch (all ranks)
    g = lambda rows: grad_of(data, w0, rows, mode, tokens, seqs, MAX_LEN, kl, loss, tis)  # noqa: E731

    full = g(range(8))
    singles = sum(g([i]) for i in range(8))
    # 2 DP ranks x 4 rows, each rank accumulating 2 micro-batches of 2; ranks all-reduce SUM
    ranks = [g([0, 1]) + g([2, 3]), g([4, 5]) + g([6, 7])]
    dp = ranks[0] + ranks[1]
    assert full.abs().max() > 1e-3  # a non-trivial gradient
    torch.testing.assert_close(singles, full, atol=1e-6, rtol=0)
    torch.testing.assert_close(dp, full, atol=1e-6, rtol=0)


def test_local_normalisers_would_break_invariance():
    """The control: with per-micro-batch normalisers (averaged over micro-batches, the naive
    recipe) or max_len = the local padded width, 8 x 1 no longer matches 1 x 8."""
    data, w0 = make_data()
    full = grad_of(data, w0, range(8), "token-mean", None, None, None)
    naive = sum(grad_of(data, w0, [i], "token-mean", None, None, None) for i in range(8)) / 8
    assert (naive - full).abs().max() > 1e-3
    full = grad_of(data, w0, range(8), "seq-mean-token-sum-norm", None, None, R)
    local = sum(grad_of(data, w0, [i], "seq-mean-token-sum-norm", None, 8, LENGTHS[i])
                for i in range(8))
    assert (local - full).abs().max() > 1e-3
