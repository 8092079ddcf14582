"""Token logprobs and entropies against hand-worked softmaxes and torch.distributions."""

import math

import torch

from baton.algos import entropy_from_logits, logprobs_from_logits


def test_logprobs_hand_worked():
    # logits log([1, 2, 3]) -> softmax [1/6, 2/6, 3/6]
    logits = torch.log(torch.tensor([1.0, 2.0, 3.0])).view(1, 1, 3)  # [B=1, R=1, V=3]
    for label, p in [(0, 1 / 6), (1, 2 / 6), (2, 3 / 6)]:
        lp = logprobs_from_logits(logits, torch.tensor([[label]]))
        assert math.isclose(lp.item(), math.log(p), rel_tol=1e-6)


def test_logprobs_temperature():
    # logits [0, 2 ln 2] at T=2 -> [0, ln 2] -> softmax [1/3, 2/3]
    logits = torch.tensor([0.0, 2 * math.log(2)]).view(1, 1, 2)
    lp = logprobs_from_logits(logits, torch.tensor([[1]]), temperature=2.0)
    assert math.isclose(lp.item(), math.log(2 / 3), rel_tol=1e-6)
    # temperature 0 (greedy) is scored at temperature 1, per the Engine protocol
    lp0 = logprobs_from_logits(logits, torch.tensor([[1]]), temperature=0.0)
    assert math.isclose(lp0.item(), math.log(4 / 5), rel_tol=1e-6)  # softmax [1, 4] / 5


def test_entropy_hand_worked():
    # uniform over 4 -> ln 4; [0, 2 ln 2] at T=2 -> p = [1/3, 2/3]
    assert math.isclose(entropy_from_logits(torch.zeros(1, 1, 4)).item(), math.log(4), rel_tol=1e-6)
    logits = torch.tensor([0.0, 2 * math.log(2)]).view(1, 1, 2)
    h = -(1 / 3 * math.log(1 / 3) + 2 / 3 * math.log(2 / 3))
    assert math.isclose(entropy_from_logits(logits, 2.0).item(), h, rel_tol=1e-6)


def test_matches_torch_distributions_and_bf16_rows():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 4  # [B, R, V]
    labels = torch.randint(0, 11, (3, 5), generator=g)  # [B, R]
    dist = torch.distributions.Categorical(logits=logits / 0.7)
    torch.testing.assert_close(logprobs_from_logits(logits, labels, 0.7), dist.log_prob(labels))
    torch.testing.assert_close(entropy_from_logits(logits, 0.7), dist.entropy())
    # bf16 logits go through the row-by-row float32 path and return float32
    lp16 = logprobs_from_logits(logits.bfloat16(), labels, 0.7)
    assert lp16.dtype == torch.float32
    ref16 = torch.distributions.Categorical(logits=logits.bfloat16().float() / 0.7).log_prob(labels)
    torch.testing.assert_close(lp16, ref16, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy_from_logits(logits.bfloat16(), 0.7),
                               torch.distributions.Categorical(
                                   logits=logits.bfloat16().float() / 0.7).entropy(),
                               atol=1e-5, rtol=0)


def test_logprobs_gradient_is_onehot_minus_softmax():
    logits = torch.randn(1, 1, 4, requires_grad=True)
    logprobs_from_logits(logits, torch.tensor([[2]])).sum().backward()
    expected = torch.nn.functional.one_hot(torch.tensor(2), 4) - logits.detach().softmax(-1)
    torch.testing.assert_close(logits.grad.view(4), expected.view(4).float())


def test_chunked_path_matches_and_keeps_gradients(monkeypatch):
    import baton.algos.logprobs as lp_mod

    g = torch.Generator().manual_seed(1)
    full = torch.randn(2, 9, 7, generator=g)  # [B, T, V]: the logits of a whole forward pass
    logits = full[:, 2:, :]  # [B, R=7, V] a non-contiguous slice, as a trainer takes it
    labels = torch.randint(0, 7, (2, 7), generator=g)
    monkeypatch.setattr(lp_mod, "CHUNK_ELEMENTS", 3 * 7)  # 3 tokens per chunk: chunks 3, 3, 1
    for x in (logits, logits.bfloat16()):
        ref = torch.distributions.Categorical(logits=x.float() / 0.7)
        torch.testing.assert_close(logprobs_from_logits(x, labels, 0.7), ref.log_prob(labels))
        torch.testing.assert_close(entropy_from_logits(x, 0.7), ref.entropy())
    # gradients through the chunks (and through the in-place scaling of the bf16 copy)
    for dtype in (torch.float32, torch.bfloat16):
        w = logits.detach().to(dtype).requires_grad_()
        (logprobs_from_logits(w, labels, 0.7).sum() + entropy_from_logits(w, 0.7).sum()).backward()
        w_ref = logits.detach().to(dtype).float().requires_grad_()
        d = torch.distributions.Categorical(logits=w_ref / 0.7)
        (d.log_prob(labels).sum() + d.entropy().sum()).backward()
        torch.testing.assert_close(w.grad.float(), w_ref.grad, atol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                                   rtol=0)
