"""Kernels a decode token (issue 43), counted on the CPU by `baton.rollout.embedded.op_count`, and the
fused pieces that cut them (`baton.rollout.embedded.kernels`) against HF's arithmetic.

Counts at the Qwen2.5-0.5B head layout (14 heads, 2 KV heads, 24 layers) in bf16; the hidden
and MLP sizes are shrunk, as a count does not depend on them (bench/decode_ops.py counts
the full shape: the same figures). Before this change: 28 a layer, 686 a token.
"""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from baton.models import build_tiny_model
from baton.rollout.embedded.kernels import half_roll, rms_norm, rope_matrices
from baton.rollout.embedded.llama import LlamaRunner, fuse_storage
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.embedded.op_count import count_kernels
from baton.protocol import SamplingParams
from baton.rollout.embedded.static_decode import StaticDecoder

torch.set_num_threads(1)
HEADS = dict(num_attention_heads=14, num_key_value_heads=2, hidden_size=56, intermediate_size=64, vocab_size=64)
# kernels a layer / outside the layers, static decode step (what a CUDA graph captures):
# RMSNorm 1, Q|K|V 1, RoPE 1 (bmm), K and V into the cache 2, SDPA 1, o_proj + residual 1,
# RMSNorm 1, gate|up 1, SiLU and * up 2, down + residual 1 = 12; Qwen3's q/k RMSNorm +2.
# Outside: the mask 2, RoPE matrices 3 (gather, mul, addcmul), embedding 1, final norm 1,
# LM head 1 = 8.
PER_LAYER = {"qwen2": 12, "llama": 12, "qwen3": 14, "mistral": 12}
OUTSIDE = 8


def model_of(family: str, layers: int, **extra) -> torch.nn.Module:
    if family == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=layers, **HEADS)).to(torch.bfloat16).eval()
    if family == "mistral":
        cfg = MistralConfig(num_hidden_layers=layers, **HEADS, **extra)
        return MistralForCausalLM(cfg).to(torch.bfloat16).eval()
    sizes = dict(hidden=56, heads=14, kv_heads=2, intermediate=64, vocab_size=64)
    return build_tiny_model(None, family=family, layers=layers, **sizes).to(torch.bfloat16).eval()


def step_kernels(model) -> int:
    return step_kernels_of(LlamaRunner(model))


@pytest.mark.parametrize("family", list(PER_LAYER))
def test_kernels_a_layer_and_a_token_at_the_05b_layout(family):
    one, full = step_kernels(model_of(family, 1)), step_kernels(model_of(family, 24))
    assert (full - one) / 23 == PER_LAYER[family]
    assert full == OUTSIDE + 24 * PER_LAYER[family]  # qwen2 / llama: 296 (was 686)


def test_a_window_shorter_than_the_cache_costs_three_kernels_a_token():
    # (slots <= slot - window) | (slots > slot): a sub, a compare and an or, once a step
    assert step_kernels(model_of("mistral", 2, sliding_window=4)) == step_kernels(model_of("mistral", 2)) + 3


def test_views_are_not_counted_and_rms_norm_is_one_kernel():
    x, w = torch.randn(4, 8), torch.randn(8)
    _, ops = count_kernels(lambda: (x.view(2, 16).t() * 2, rms_norm(x, w, 1e-6)))
    assert ops == {"aten.mul": 1, "aten._fused_rms_norm": 1}
    # the CPU stand-in for the CUDA kernel is gone afterwards: the real composite again
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "CPU")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_hfs(dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 3, 64).to(dtype)
    hf = LlamaRMSNorm(64, eps=1e-6).to(dtype)
    hf.weight.data = torch.randn(64).to(dtype)
    want = hf(x)
    # normalise, then scale: HF's arithmetic (and rounding) in every dtype
    assert torch.equal(rms_norm(x, None, 1e-6) * hf.weight, want)
    got = rms_norm(x, hf.weight, 1e-6)  # one kernel: fp32 bit for bit, else one rounding fewer
    if dtype == torch.float32:
        assert torch.equal(got, want)
    else:
        ulp = torch.finfo(dtype).eps * want.float().abs().clamp(min=1e-3)
        assert ((got.float() - want.float()).abs() <= ulp).all()


def test_rope_matrix_by_hand_and_against_hf():
    # D = 4, one row: x @ R = x * cos + rotate_half(x) * sin, rotate_half([a, b, c, d]) = [-c, -d, a, b]
    cos = torch.tensor([0.5, 0.25, 0.5, 0.25])
    signed = torch.tensor([-2.0, -4.0, 2.0, 4.0])  # sin = [2, 4, 2, 4], rotate_half's sign folded in
    R = rope_matrices(torch.stack([cos, signed])[None], torch.eye(4), half_roll(4, torch.float32, "cpu"))
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])  # [1 row, 1 head, D]
    assert torch.bmm(x, R).tolist() == [[[1 * 0.5 - 3 * 2, 2 * 0.25 - 4 * 4, 3 * 0.5 + 1 * 2, 4 * 0.25 + 2 * 4]]]
    # random angles, 6 rows x 5 heads x 64: HF's apply_rotary_pos_emb to an ulp (fp32)
    torch.manual_seed(0)
    angles = torch.rand(6, 32) * 100
    emb = torch.cat([angles, angles], -1)
    c, s = emb.cos(), emb.sin()
    x = torch.randn(6, 5, 64)
    want, _ = apply_rotary_pos_emb(x, x, c, s, unsqueeze_dim=1)
    cs = torch.stack([c, torch.cat([-s[:, :32], s[:, 32:]], -1)], 1)  # [6, 2, 64]
    got = torch.bmm(x, rope_matrices(cs, torch.eye(64), half_roll(64, torch.float32, "cpu")))
    torch.testing.assert_close(got, want, atol=5e-7, rtol=0)


# Tokens and logprob sums of the engine at 2e8998f (before the fused pieces), fp32, tiny
# models of tests/rollout/test_engine.py, n=2, temperature 0.7, 10 new tokens, seed 0.
BEFORE = {
    "qwen2": ([[226, 58, 109, 122, 180, 180, 182, 97, 29, 109], [230, 164, 222, 225, 121, 226, 55, 159, 89, 92],
               [45, 84, 131, 230, 126, 107, 232, 66, 107, 257], [45, 108, 131, 3, 11, 14, 250, 94, 183, 200],
               [10, 10, 202, 50, 4, 87, 166, 172, 202, 143], [136, 42, 186, 186, 223, 65, 161, 206, 257, 6],
               [131, 118, 189, 110, 29, 181, 152, 137, 184, 226], [209, 169, 175, 107, 31, 6, 136, 8, 136, 242]],
              [-27.24344, -35.81855, -27.81504, -28.06868, -26.80238, -35.39567, -28.69263, -21.53953]),
    "llama": ([[182, 5, 151, 41, 198, 91, 243, 99, 139, 257], [228, 184, 232, 257, 246, 195, 139, 175, 207, 228],
               [11, 125, 93, 251, 2], [37, 210, 110, 10, 11, 217, 142, 153, 229, 63],
               [49, 4, 247, 21, 137, 32, 205, 15, 191, 114], [118, 36, 259, 126, 212, 84, 258, 121, 120, 159],
               [5, 137, 155, 125, 85, 134, 183, 171, 204, 213], [137, 153, 200, 207, 53, 57, 83, 83, 48, 256]],
              [-21.71454, -27.35191, -18.29235, -34.89112, -31.01364, -32.10065, -41.2381, -34.61305]),
}


@pytest.mark.parametrize("family", list(BEFORE))
@pytest.mark.parametrize("static", [False, "fixed"])
def test_same_tokens_and_logprobs_as_before(family, static):
    model = build_tiny_model(None, family=family, seed=0, hidden=32, layers=2, heads=4, kv_heads=2,
                             intermediate=64, initializer_range=0.3, tie_word_embeddings=family == "qwen2").eval()
    outs = EmbeddedEngine(model, static_decode=static).generate(
        [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [40]],
        SamplingParams(n=2, temperature=0.7, max_new_tokens=10, seed=0))
    tokens, sums = BEFORE[family]
    assert [c.token_ids for c in outs] == tokens
    # rounding only (RoPE's bmm sums in another order: <= 1 ulp a value); measured <= 8e-6
    # on a 10-token sum of logprobs of ~-30 (bench/decode_ops.py: <= 7.2e-6 on one logprob)
    torch.testing.assert_close(torch.tensor([sum(c.logprobs) for c in outs]), torch.tensor(sums),
                               atol=3e-5, rtol=0)


def test_fuse_storage_gives_one_qkv_and_one_gate_up_matmul_without_a_copy():
    """An engine's own copy read in place (fuse_weights=False, as the rollout worker builds it):
    17 kernels a layer with Q, K, V (gate, up) apart, 12 once `fuse_storage` lays them back to
    back; same values, same tokens; weight sync (copy_ in place) and a discard-wake keep working."""
    model = model_of("qwen2", 1)
    apart = step_kernels_of(LlamaRunner(model, fuse=False))
    attn = model.model.layers[0].self_attn
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fuse_storage(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert attn.k_proj.weight.data_ptr() == attn.q_proj.weight.data_ptr() + attn.q_proj.weight.nbytes
    assert (apart, step_kernels_of(LlamaRunner(model, fuse=False))) == (OUTSIDE + 17, OUTSIDE + 12)

    prompts, params = [[5, 6, 7, 8], [9, 10]], SamplingParams(n=2, temperature=0.7, max_new_tokens=8, seed=0)
    small = build_tiny_model(None, family="qwen2", seed=0, hidden=32, layers=2, heads=4, kv_heads=2,
                             intermediate=64, initializer_range=0.3).eval()
    want = EmbeddedEngine(small).generate(prompts, params)
    copy = build_tiny_model(None, family="qwen2", seed=1, hidden=32, layers=2, heads=4, kv_heads=2,
                            intermediate=64, initializer_range=0.3).eval()
    engine = EmbeddedEngine(copy, fuse_weights=False, sleep_mode="discard")
    for _ in range(2):  # fill (in place), generate, discard, wake: the layout is made again
        fuse_storage(copy)
        engine.update_weights(small.state_dict().items(), version=1)
        got = engine.generate(prompts, params)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        for a, b in zip(got, want):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
        engine.sleep()
        engine.wake()


def step_kernels_of(runner: LlamaRunner) -> int:
    runner.pack()
    with torch.no_grad():
        ids = torch.randint(4, 60, (4, 8))
        runner.start(ids, torch.ones_like(ids), 8, 1)
        return sum(count_kernels(StaticDecoder(runner, 4, step="fixed").step)[1].values())
