"""`baton.algos.linear_logprobs`: logprobs and entropies from hidden states and the output
projection in chunks equal the plain computation through full logits (values and gradients,
float64), by hand on a two-token vocabulary, under torch.autograd.gradcheck, and autograd
keeps nothing of size [N, V]."""

import math

import pytest
import torch

from baton.algos import entropy_from_logits, logprobs_from_logits
from baton.algos.linear_logprobs import linear_logprobs


def test_two_token_vocabulary_by_hand():
    # logits = h * w = [0, ln 3]: p = [1/4, 3/4]; at T = 2, z = [0, ln 3 / 2]: p1 = sqrt3 / (1 + sqrt3)
    h = torch.tensor([[1.0]], dtype=torch.float64)
    w = torch.tensor([[0.0], [math.log(3)]], dtype=torch.float64)
    logp, ent = linear_logprobs(h, w, torch.tensor([1]), with_entropy=True)
    assert logp.item() == pytest.approx(math.log(0.75), abs=1e-15)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-15)
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    logp, ent = linear_logprobs(h, w, torch.tensor([0]), temperature=2.0, with_entropy=True)
    assert logp.item() == pytest.approx(math.log(1 - p1), abs=1e-15)
    assert ent.item() == pytest.approx(-(p1 * math.log(p1) + (1 - p1) * math.log(1 - p1)), abs=1e-15)


def plain(hidden, weight, labels, temperature):
    logits = hidden @ weight.T  # [B, R, V]
    return (logprobs_from_logits(logits, labels, temperature=temperature),
            entropy_from_logits(logits, temperature=temperature))


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("chunk", [3, 1000])  # 3: several chunks and a ragged last one
def test_values_and_gradients_equal_the_plain_path(temperature, chunk):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 8, dtype=torch.float64, generator=g)
    weight = torch.randn(11, 8, dtype=torch.float64, generator=g)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    a, b = torch.randn(2, 5, dtype=torch.float64, generator=g), torch.randn(2, 5, dtype=torch.float64, generator=g)
    results = []
    for fused in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if fused:
            logp, ent = linear_logprobs(h, w, labels, temperature, with_entropy=True, entropy_grad=True,
                                        chunk_tokens=chunk)
        else:
            logp, ent = plain(h, w, labels, temperature)
        (logp * a + ent * b).sum().backward()
        results.append((logp.detach(), ent.detach(), h.grad, w.grad))
    for x, y in zip(*results):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=0)


def test_gradcheck_with_and_without_the_entropy_gradient():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 4, (5,), generator=g)
    both = lambda h, w: linear_logprobs(h, w, y, 0.8, with_entropy=True, entropy_grad=True, chunk_tokens=2)
    assert torch.autograd.gradcheck(both, (h, w))
    only_logp = lambda h, w: linear_logprobs(h, w, y, 0.8, with_entropy=True, chunk_tokens=2)[0]
    assert torch.autograd.gradcheck(only_logp, (h, w))
    logp, ent = linear_logprobs(h, w, y, with_entropy=True)
    assert logp.requires_grad and not ent.requires_grad  # a metric unless entropy_grad


def test_autograd_keeps_nothing_of_the_logits_size():
    N, H, V = 64, 8, 500
    hidden = torch.randn(N, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    labels = torch.randint(0, V, (N,))

    def largest_saved(fn):
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return max(sizes)

    assert largest_saved(lambda: plain(hidden, weight, labels, 0.7)) >= N * V  # the plain path does
    assert largest_saved(lambda: linear_logprobs(hidden, weight, labels, 0.7, with_entropy=True,
                                                 entropy_grad=True, chunk_tokens=16)) == V * H


def test_bf16_autocast_matches_the_plain_autocast_path():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(3, 6, 16, generator=g)
    weight = torch.randn(40, 16, generator=g)
    labels = torch.randint(0, 40, (3, 6), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused, _ = linear_logprobs(hidden, weight, labels, 0.7, chunk_tokens=5)
        want = logprobs_from_logits(torch.nn.functional.linear(hidden, weight), labels, temperature=0.7)
    assert fused.dtype == want.dtype == torch.float32
    # the same bf16 logits up to the matmul's blocking: a bf16 ulp of |logits| ~ 10 (0.06)
    torch.testing.assert_close(fused, want, atol=0.1, rtol=0)
