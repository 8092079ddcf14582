"""DPO losses (sigmoid + label smoothing, ipo, hinge, reference-free): hand-worked values,
metrics, and gradient invariance to how the pairs are split (1 x 8 == 8 x 1 == 2 x 4)."""

import math

import pytest
import torch

from baton.algos import DPO_LOSSES, dpo_loss, logprobs_from_logits, sequence_logprobs

LN1PE = math.log(1 + math.exp(-1))  # -log sigma(1) = 0.313262; -log sigma(-1) = 1 + LN1PE


def t(*x):
    return torch.tensor(x, dtype=torch.float64)


def test_sequence_logprobs_sums_real_tokens():
    lp = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -9.0, -9.0]])
    assert sequence_logprobs(lp, torch.tensor([[1, 1, 0], [1, 0, 0]])).tolist() == [-3.0, -0.5]


def test_sigmoid_hand_worked_with_metrics():
    # pair 0: chosen log-ratio -3 - (-4) = 1, rejected -5 - (-5) = 0 -> h = 1
    # pair 1: chosen -2.5 - (-2) = -0.5, rejected -1 - (-1.5) = 0.5 -> h = -1
    # beta 1: losses -log sigma(1) = 0.313262, -log sigma(-1) = 1.313262 -> mean 0.813262
    kw = dict(chosen_logps=t(-3, -2.5).requires_grad_(), rejected_logps=t(-5, -1),
              ref_chosen_logps=t(-4, -2), ref_rejected_logps=t(-5, -1.5), beta=1.0)
    loss, m = dpo_loss("sigmoid", **kw)
    assert loss.item() == pytest.approx((LN1PE + 1 + LN1PE) / 2)
    # d loss / d chosen_logp_0 = -beta sigma(-beta h) / P = -(1 - 0.731059) / 2 = -0.134471
    loss.backward()
    assert kw["chosen_logps"].grad[0].item() == pytest.approx(-(1 - 1 / (1 + math.exp(-1))) / 2)
    # rewards beta * log-ratio: chosen [1, -0.5], rejected [0, 0.5]
    expected = {"rewards/chosen": 0.25, "rewards/rejected": 0.25, "rewards/margins": 0.0,
                "rewards/accuracies": 0.5, "logps/chosen": -2.75, "logps/rejected": -3.0,
                "kl": (1 - 0.5 + 0 + 0.5) / 4}
    assert {k: pytest.approx(v) for k, v in expected.items()} == {k: v.item() for k, v in m.items()}
    # conservative DPO, eps 0.1, pair 0 alone: 0.9 * 0.313262 + 0.1 * 1.313262 = 0.413262
    one = {k: v[:1].detach() for k, v in kw.items() if k != "beta"}
    loss, _ = dpo_loss("sigmoid", **one, beta=1.0, label_smoothing=0.1)
    assert loss.item() == pytest.approx(0.9 * LN1PE + 0.1 * (1 + LN1PE))
    # explicit global pair count: 2 pairs here of 4 in the whole batch -> sum / 4
    kw["chosen_logps"] = kw["chosen_logps"].detach()
    assert dpo_loss("sigmoid", **kw, global_pairs=4)[0].item() == pytest.approx((1 + 2 * LN1PE) / 4)


def test_ipo_length_normalised_by_default():
    # chosen log-ratio 2 over 4 tokens, rejected -1 over 2 tokens:
    #   normalised h = 0.5 - (-0.5) = 1: beta 1 -> (1 - 0.5)^2 = 0.25; beta 0.5 -> (1 - 1)^2 = 0
    #   length_norm=False: h = 3 -> (3 - 0.5)^2 = 6.25
    kw = dict(chosen_logps=t(-1), rejected_logps=t(-4), ref_chosen_logps=t(-3),
              ref_rejected_logps=t(-3), chosen_lengths=t(4), rejected_lengths=t(2))
    assert dpo_loss("ipo", **kw, beta=1.0)[0].item() == pytest.approx(0.25)
    assert dpo_loss("ipo", **kw, beta=0.5)[0].item() == pytest.approx(0.0)
    assert dpo_loss("ipo", **kw, beta=1.0, length_norm=False)[0].item() == pytest.approx(6.25)
    with pytest.raises(ValueError, match="lengths"):
        dpo_loss("ipo", chosen_logps=t(-1), rejected_logps=t(-4), ref_chosen_logps=t(-3),
                 ref_rejected_logps=t(-3), beta=1.0)


def test_hinge_and_reference_free():
    # h = 1: beta 0.5 -> relu(1 - 0.5) = 0.5; beta 2 -> 0; h = -1, beta 0.5 -> 1.5
    kw = dict(chosen_logps=t(-3, -2.5), rejected_logps=t(-5, -1), ref_chosen_logps=t(-4, -2),
              ref_rejected_logps=t(-5, -1.5))
    assert DPO_LOSSES["hinge"](chosen_logratios=t(1, -1), rejected_logratios=t(0, 0),
                               beta=0.5).tolist() == [0.5, 1.5]
    assert dpo_loss("hinge", **kw, beta=0.5)[0].item() == pytest.approx(1.0)
    assert dpo_loss("hinge", **{k: v[:1] for k, v in kw.items()}, beta=2.0)[0].item() == 0.0
    # reference-free: h = log pi(c) - log pi(r) = -3 - (-5) = 2 -> -log sigma(2) = 0.126928
    loss, m = dpo_loss("sigmoid", chosen_logps=t(-3), rejected_logps=t(-5), beta=1.0,
                       reference_free=True)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-2)))
    assert m["rewards/chosen"].item() == -3 and "kl" not in m
    with pytest.raises(ValueError, match="reference_free"):
        dpo_loss("sigmoid", chosen_logps=t(-3), rejected_logps=t(-5))
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss("sigmoid", **kw, label_smoothing=0.5)


def test_no_pairs_gives_zero_not_nan():
    e = torch.zeros(0, requires_grad=True)
    loss, m = dpo_loss("sigmoid", chosen_logps=e, rejected_logps=e, ref_chosen_logps=e.detach(),
                       ref_rejected_logps=e.detach(), global_pairs=8)
    assert loss.item() == 0 and all(v.item() == 0 for v in m.values())
    loss.backward()  # a rank that drew no pairs still takes part in the backward


# --- invariance ------------------------------------------------------------------------
P, R, H, V = 8, 6, 4, 5
CASES = [("sigmoid", dict(label_smoothing=0.1)), ("ipo", {}), ("ipo", dict(length_norm=False)),
         ("hinge", {}), ("sigmoid", dict(reference_free=True))]


def make_pairs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * P, R, H, generator=g)  # rows 0..7 chosen, 8..15 rejected
    labels = torch.randint(0, V, (2 * P, R), generator=g)
    lengths = torch.randint(1, R + 1, (2 * P,), generator=g)
    mask = (torch.arange(R) < lengths[:, None]).long()  # [2P, R]
    w0 = torch.randn(H, V, generator=g)
    ref = sequence_logprobs(logprobs_from_logits(x @ w0, labels), mask) + torch.randn(2 * P, generator=g)
    return x, labels, mask, ref, w0


def pair_grad(data, pairs, name, kwargs, global_pairs):
    x, labels, mask, ref, w0 = data
    rows = torch.tensor(list(pairs) + [p + P for p in pairs])  # a pair's rows travel together
    w = w0.clone().requires_grad_()
    seq = sequence_logprobs(logprobs_from_logits(x[rows] @ w, labels[rows]), mask[rows])  # [2p]
    n, lens = len(pairs), mask[rows].sum(-1)
    ref_kw = {} if kwargs.get("reference_free") else dict(ref_chosen_logps=ref[rows][:n],
                                                          ref_rejected_logps=ref[rows][n:])
    loss, _ = dpo_loss(name, chosen_logps=seq[:n], rejected_logps=seq[n:], beta=0.3,
                       chosen_lengths=lens[:n], rejected_lengths=lens[n:],
                       global_pairs=global_pairs, **ref_kw, **kwargs)
    loss.backward()
    return w.grad


@pytest.mark.parametrize("name,kwargs", CASES)
def test_gradient_invariant_to_pair_micro_batching_and_dp(name, kwargs):
    data = make_pairs()
    g = lambda pairs: pair_grad(data, pairs, name, kwargs, P)  # noqa: E731
    full = g(range(P))
    singles = sum(g([i]) for i in range(P))
    dp = (g([0, 1]) + g([2, 3])) + (g([4, 5]) + g([6, 7]))  # 2 ranks x 2 micro-batches of 2
    assert full.abs().max() > 1e-3
    torch.testing.assert_close(singles, full, atol=1e-6, rtol=0)
    torch.testing.assert_close(dp, full, atol=1e-6, rtol=0)
    uneven = g([0, 1, 2]) + g([3, 4, 5, 6, 7])  # unequal micro-batches: still exact
    torch.testing.assert_close(uneven, full, atol=1e-6, rtol=0)
    # the control: local pair counts (the mean of micro-batch means) would break it there
    naive = (pair_grad(data, [0, 1, 2], name, kwargs, None)
             + pair_grad(data, [3, 4, 5, 6, 7], name, kwargs, None)) / 2
    assert (naive - full).abs().max() > 1e-4
