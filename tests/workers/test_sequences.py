"""Response logprobs with each prompt computed once equal those of a full forward pass,
values and gradients, for left-padded prompts of different lengths in groups."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from baton import fields as F
from baton.batch import Batch
from baton.workers import sequences
from baton.workers.sequences import length_buckets, prompt_groups, response_logprobs


def tiny_double_model() -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 of 64 tokens in float64, seeded (0)."""
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64,
                                        max_position_embeddings=64)).double()


def grouped_batch(n=3):
    g = torch.Generator().manual_seed(0)
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    P, R = 4, 5
    rows = []
    for p in prompts:
        for j in range(n):
            length = 1 + (len(p) + j) % R
            rows.append((p, torch.randint(4, 60, (length,), generator=g).tolist()))
    B = len(rows)
    p_ids = torch.zeros(B, P, dtype=torch.long)
    p_mask = torch.zeros(B, P, dtype=torch.long)
    r_ids = torch.zeros(B, R, dtype=torch.long)
    r_mask = torch.zeros(B, R, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        p_ids[i, P - len(p):], p_mask[i, P - len(p):] = torch.tensor(p), 1
        r_ids[i, :len(r)], r_mask[i, :len(r)] = torch.tensor(r), 1
    return Batch({F.PROMPT_IDS: p_ids, F.PROMPT_MASK: p_mask, F.RESPONSE_IDS: r_ids, F.RESPONSE_MASK: r_mask})


def test_prompt_groups_finds_runs():
    first, run = prompt_groups(grouped_batch(n=2))
    assert first.tolist() == [0, 2, 4] and run.tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("call_cost", [None, 0])  # 0: one length bucket per response length
def test_shared_prompt_forward_equals_full_forward_and_gradient(call_cost, monkeypatch):
    if call_cost is not None:
        monkeypatch.setattr(sequences, "CALL_COST_TOKENS", call_cost)
    model = tiny_double_model()
    batch = grouped_batch()
    mask = batch[F.RESPONSE_MASK].float()

    def run(share):
        model.zero_grad()
        logp, ent = response_logprobs(model, batch, temperature=0.7, with_entropy=True, share_prompts=share)
        (logp * mask).sum().backward()
        return logp.detach() * mask, ent * mask, [p.grad.clone() for p in model.parameters()]

    (full_logp, full_ent, full_grads), (logp, ent, grads) = run(False), run(True)
    # float64 model: the two paths differ by float64 summation order (values to ~1e-15),
    # except that transformers' RMSNorm computes in float32 in any dtype, so a gradient
    # summed over a group's rows before a prompt's norm rounds at float32 there: a few float32
    # ulps (6e-8) of each gradient tensor's scale (1.3e-7 seen); bound 1e-6 of the scale.
    torch.testing.assert_close(logp, full_logp, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent, full_ent, atol=1e-12, rtol=0)
    for a, b in zip(grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-6 * b.abs().max().item(), rtol=0)


def test_length_buckets_minimise_padding_plus_call_cost():
    # lengths 1,1,1,1,2,8 with a call cost of 5 padded tokens:
    #   one bucket           6*8 + 5                 = 53
    #   {1,2} {8}            5*2 + 5 + 1*8 + 5       = 28   <- best
    #   {1} {2} {8}          4*1 + 5 + 2 + 5 + 8 + 5 = 29
    #   {1} {2,8}            4 + 5 + 2*8 + 5         = 30
    buckets = length_buckets(torch.tensor([1, 8, 1, 2, 1, 1]), call_cost=5)
    assert [b.tolist() for b in buckets] == [[0, 2, 3, 4, 5], [1]]
    # a huge call cost gives one bucket; zero cost gives one per distinct length
    assert len(length_buckets(torch.tensor([1, 8, 1, 2]), call_cost=1000)) == 1
    assert len(length_buckets(torch.tensor([1, 8, 1, 2]), call_cost=0)) == 3


@pytest.mark.parametrize("share", [True, False])
def test_fused_head_equals_the_logits_path_values_and_gradients(share):
    """The default path (hidden states through `linear_logprobs`, no full logits) gives the
    plain path's logprobs, entropies and gradients, entropy bonus included, in float64."""
    model = tiny_double_model()
    assert sequences.fused_head(model) is not None
    batch = grouped_batch()
    mask = batch[F.RESPONSE_MASK].double()
    w = torch.linspace(-1, 1, mask.shape[1], dtype=torch.float64)

    def run(fused):
        model.zero_grad()
        logp, ent = response_logprobs(model, batch, temperature=0.7, with_entropy=True, entropy_grad=True,
                                      share_prompts=share, fused=fused)
        ((logp + 0.1 * ent) * w * mask).sum().backward()
        return logp.detach() * mask, ent.detach() * mask, [p.grad.clone() for p in model.parameters()]

    (logp, ent, grads), (want_logp, want_ent, want_grads) = run(True), run(False)
    torch.testing.assert_close(logp, want_logp, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent, want_ent, atol=1e-12, rtol=0)
    for a, b in zip(grads, want_grads):  # bound: test_shared_prompt_forward_equals_full_forward_and_gradient
        torch.testing.assert_close(a, b, atol=1e-6 * b.abs().max().item(), rtol=0)


def test_fused_head_only_where_logits_are_the_head_of_the_hidden_state():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    assert sequences.fused_head(gpt2) is None  # not in FUSED_HEAD_TYPES: the logits path


def test_top_k_distributions_match_the_logprobs_and_the_full_softmax():
    """`response_topk` (GKD's distributions): its sampled-token logprobs and entropy equal
    `response_logprobs`'; its whole-vocabulary rows are the log-softmax of the plain logits;
    its own top k are the k largest of them; gathered at other ids, those ids' entries."""
    model = tiny_double_model()
    batch = grouped_batch()
    mask = batch[F.RESPONSE_MASK].bool()
    logp, ent = response_logprobs(model, batch, temperature=0.7, with_entropy=True)
    full = sequences.response_topk(model, batch, temperature=0.7)  # k=0: the whole vocabulary
    assert full["topk_logprobs"].shape == (*mask.shape, 64)
    torch.testing.assert_close(full["logprobs"][mask], logp[mask])
    torch.testing.assert_close(full["entropy"][mask], ent[mask])
    plain = sequences._logits_full(model, batch, torch.device("cpu"))  # [B, R, V] no sharing, no fusing
    torch.testing.assert_close(full["topk_logprobs"][mask], torch.log_softmax(plain / 0.7, -1)[mask])
    top = sequences.response_topk(model, batch, temperature=0.7, k=5)
    torch.testing.assert_close(top["topk_logprobs"][mask], full["topk_logprobs"].topk(5, -1).values[mask])
    ids = top["topk_ids"].flip(-1)  # other ids: gathered in their order
    other = sequences.response_topk(model, batch, temperature=0.7, ids=ids)
    torch.testing.assert_close(other["topk_logprobs"][mask], full["topk_logprobs"].gather(-1, ids)[mask])
    assert torch.equal(other["topk_ids"][mask], ids[mask])
