"""`baton tinker` runs a request's data in right-padded micro-batches (`Trainee`): each datum's
logprobs, per-token loss, the request's `loss:sum` and the accumulated gradient equal what one
forward pass per datum gives (the trainee with a budget of one token: every datum alone), to
fp32 rounding; and the cut into batches keeps the request's order within the token budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from baton.tinker.trainee import Trainee, lora_targets, micro_batches
from baton.tinker.wire import Datum


def test_micro_batches_are_consecutive_and_within_the_budget():
    # budget 10: [3, 5] pads to 2 x 5 = 10; adding 2 would be 3 x 5 = 15; 10 alone is 10; 12 > 10 alone
    assert micro_batches([3, 5, 2, 10, 12, 1, 1], 10) == [[0, 1], [2], [3], [4], [5, 6]]
    assert micro_batches([4, 4, 4], 1) == [[0], [1], [2]]  # a budget of one token: every datum alone
    assert micro_batches([], 10) == []


def data(vocab: int, lengths: list[int]) -> list[Datum]:
    rng = np.random.default_rng(0)
    return [Datum(tokens=[int(x) for x in rng.integers(0, vocab, n)],
                  inputs={"target_tokens": rng.integers(0, vocab, n).astype(np.int64),
                          "logprobs": (-rng.random(n) * 3).astype(np.float32),
                          "advantages": rng.standard_normal(n).astype(np.float32)}) for n in lengths]


@pytest.mark.parametrize("loss_fn", ["ppo", "importance_sampling"])
def test_a_padded_batch_computes_what_each_datum_alone_does(tiny_dir, loss_fn):
    lengths = [5, 17, 9, 30, 2, 11, 23, 8]  # widths differ: every batch holds padding
    cfg = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2} if loss_fn == "ppo" else {}
    results = []
    for budget in (1, 64):  # alone; then 2-4 data a batch
        trainee = Trainee("m", str(tiny_dir), rank=4, targets=lora_targets(True, True, True), seed=0)
        assert len(micro_batches(lengths, budget)) == (8 if budget == 1 else 4)
        trainee.tokens_per_batch = budget
        outputs, metrics = trainee.forward_backward(data(trainee.vocab, lengths), loss_fn, cfg, forward_only=False)
        grads = {n: p.grad.clone() for n, p in trainee.model.named_parameters() if p.grad is not None}
        results.append((outputs, metrics, grads))
    (alone, alone_m, alone_g), (batched, batched_m, batched_g) = results
    for a, b, n in zip(alone, batched, lengths):
        assert a["logprobs"].shape == b["logprobs"].shape == (n,)
        np.testing.assert_allclose(b["logprobs"], a["logprobs"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(b["elementwise_loss"], a["elementwise_loss"], rtol=1e-5, atol=1e-5)
    assert batched_m["loss:sum"] == pytest.approx(alone_m["loss:sum"], rel=1e-5)
    assert alone_g.keys() == batched_g.keys() and alone_g
    for name, g in alone_g.items():
        torch.testing.assert_close(batched_g[name], g, rtol=1e-4, atol=1e-5 * float(g.abs().max()) + 1e-8)
