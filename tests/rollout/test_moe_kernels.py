"""The fast path's mixture-of-experts MLP (`baton.rollout.embedded.moe`): its three ways (gathered
experts, every expert, sorted slots) give HF's block output, and a decode step's kernels do not
grow with the number of experts.

Tolerance (fp32): the same products as HF's block, summed in another order; measured ~1e-7 on
outputs of ~1e-2, asserted at 1e-5 absolute."""

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from baton.rollout.embedded.moe import expert_pieces, moe_forward
from baton.rollout.embedded.op_count import count_kernels

SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=0.3, num_experts_per_tok=2)


def _block(family: str, experts: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "mixtral":
        return MixtralForCausalLM(MixtralConfig(**SIZES, num_local_experts=experts)).model.layers[0].mlp.eval()
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**SIZES, moe_intermediate_size=48, num_experts=experts,
                                              norm_topk_prob=False)).model.layers[0].mlp.eval()


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("rows, grouped", [(3, True), (9, True), (9, False)])  # 3*2 <= 8: gathered; 18 > 8: all
def test_every_way_gives_hfs_block_output(family, rows, grouped):
    block = _block(family)
    h = torch.randn(rows, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = block(h[None])[0]
        _, _, want_index = block.gate(h)
        got, index = moe_forward(h, expert_pieces(block, fuse=True, into=None), grouped)
    assert torch.equal(index, want_index)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_a_decode_steps_kernels_do_not_grow_with_experts():
    h = torch.randn(4, 32)
    counts = []
    for e in (4, 8, 64):  # 4 rows x top-2: every expert (4), gathered (8, 64)
        ex = expert_pieces(_block("mixtral", e), True, None)
        counts.append(sum(count_kernels(lambda: moe_forward(h, ex, True))[1].values()))
    assert max(counts) <= 20 and counts[1] == counts[2], counts
