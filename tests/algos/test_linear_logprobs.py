"""`baton.algos.linear_logprobs`: logprobs and entropies from hidden states and the output
projection in chunks equal the plain computation through full logits (values and gradients,
float64), by hand on a two-token vocabulary, under torch.autograd.gradcheck, and autograd
keeps nothing of size [N, V]; the weight's gradient under bf16 autocast is the bf16 chunk
products summed in fp32 and its backward allocates no [V, H] tensor per chunk (issue 43)."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import baton.algos.linear_logprobs as ll
from baton.algos import entropy_from_logits, logprobs_from_logits
from baton.algos.linear_logprobs import accumulate_wgrad, linear_logprobs


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


class FreshTensors(TorchDispatchMode):
    """Records the bytes of every tensor an op returns in storage none of its inputs hold
    (a new allocation; views and in-place / out= results are not)."""

    def __init__(self):
        super().__init__()
        self.nbytes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        held = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if torch.is_tensor(t)}
        self.nbytes += [t.untyped_storage().nbytes() for t in tree_flatten(out)[0]
                        if torch.is_tensor(t) and t.untyped_storage().data_ptr() not in held]
        return out


def bf16_backward(fused: bool, N=40, H=64, V=300, chunk=8, spy=None):
    """fp32 master weight and hidden under bf16 autocast (the actor on a GPU); returns the
    weight's gradient and the sizes of the tensors the backward allocated."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    weight = (torch.randn(V, H, generator=g) / 4).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=g)
    a = torch.randn(N, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = linear_logprobs(hidden, weight, labels, 0.7, with_entropy=True, entropy_grad=True,
                                    chunk_tokens=chunk, fused_wgrad=fused)
    loss = (logp * a + ent).sum()
    with FreshTensors() as rec:
        loss.backward()
    return weight.grad, rec.nbytes


def test_fp32_weight_gradient_is_the_unfused_one_bit_for_bit():
    g = torch.Generator().manual_seed(4)
    hidden, weight = torch.randn(23, 16, generator=g), torch.randn(50, 16, generator=g)
    labels = torch.randint(0, 50, (23,), generator=g)
    grads = []
    for fused in (True, False):
        w = weight.clone().requires_grad_()
        logp, ent = linear_logprobs(hidden, w, labels, 0.7, with_entropy=True, entropy_grad=True,
                                    chunk_tokens=5, fused_wgrad=fused)
        (logp.sum() + ent.sum()).backward()
        grads.append(w.grad)
    assert torch.equal(*grads)


def test_bf16_weight_gradient_sums_exact_chunk_products_in_fp32(monkeypatch):
    """Under bf16 autocast with an fp32 weight: grad W = sum over chunks of d_c.T @ h_c (bf16
    values) summed in fp32, within fp32's rounding of the fp64 sum (a few tokens' worth of
    2^-24 |d|.T|h|); the unfused path, which rounds each chunk's product to bf16, is within
    2^-8 sum_c |d_c|.T |h_c| of it."""
    seen = []

    def spy(gw, d, h, scratch):
        seen.append((d.double(), h.double()))
        return accumulate_wgrad(gw, d, h, scratch)

    monkeypatch.setattr(ll, "accumulate_wgrad", spy)
    fused, _ = bf16_backward(True)
    assert len(seen) == 5 and all(d.shape == (8, 300) for d, _ in seen)
    exact = sum(d.T @ h for d, h in seen)  # [V, H] float64: the bf16 products, summed exactly
    scale = sum(d.abs().T @ h.abs() for d, h in seen)
    assert ((fused.double() - exact).abs() <= 40 * 2**-24 * scale + 1e-30).all()
    unfused, _ = bf16_backward(False)
    assert ((unfused.double() - fused.double()).abs() <= 2**-8 * scale + 40 * 2**-24 * scale).all()
    assert not torch.equal(unfused, fused)  # the bf16 rounding the fused path no longer makes


def test_bf16_backward_allocates_no_weight_sized_tensor_per_chunk():
    """Of the backward's new tensors, those of [V, H] elements or more: the weight's bf16
    copy and the gradient buffer, once each (the unfused path: + a bf16 product and its
    fp32 copy per chunk, 5 chunks); everything else is chunk-sized or hidden's gradient."""
    N, V, H, chunk = 40, 300, 64, 8
    _, fused = bf16_backward(True)
    _, unfused = bf16_backward(False)
    big = lambda sizes: sorted(n for n in sizes if n >= V * H * 2)
    assert big(fused) == [V * H * 2, V * H * 4]
    assert big(unfused) == sorted([V * H * 2, V * H * 4] + [V * H * 2, V * H * 4] * 5)
    assert max(n for n in fused if n < V * H * 2) <= max(chunk * V * 4, N * H * 4)  # fp32 logits, grad h


def test_the_probes_no_takes_the_upcast_path(monkeypatch, caplog):
    """A device whose torch refuses a bf16 GEMM into fp32 (the probe says no, logged once):
    the weight gradient upcasts each chunk's operands, no mixed addmm is tried, and the sum
    is the exact one (what a GPU with an older torch runs; forced here on the CPU)."""
    key = ("cpu", torch.bfloat16, torch.float32)
    monkeypatch.delitem(ll._MIXED_ADDMM, key, raising=False)
    with caplog.at_level("INFO", logger="baton.algos.linear_logprobs"):
        assert ll._mixed_addmm_ok(torch.device("cpu"), torch.bfloat16, torch.float32) is False
    assert [r.getMessage() for r in caplog.records] == [
        f"addmm of torch.bfloat16 inputs into torch.float32 in place on cpu (torch {torch.__version__}): "
        "no, the operands upcast"]
    monkeypatch.setitem(ll._MIXED_ADDMM, key, False)  # the verdict, forced
    mixed, real = [], torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: mixed.append(k) if "out_dtype" in k else real(*a, **k))
    seen = []
    monkeypatch.setattr(ll, "accumulate_wgrad", lambda gw, d, h, s: seen.append((d.double(), h.double()))
                        or accumulate_wgrad(gw, d, h, s))
    grad, _ = bf16_backward(True)
    assert not mixed and len(seen) == 5
    exact = sum(d.T @ h for d, h in seen)
    scale = sum(d.abs().T @ h.abs() for d, h in seen)
    assert ((grad.double() - exact).abs() <= 40 * 2**-24 * scale + 1e-30).all()
