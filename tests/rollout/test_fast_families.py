"""The fast path (`baton.rollout.embedded.llama`) for the families users train: Qwen3 (per-head q/k
RMSNorm, head_dim apart from hidden / heads), Llama-3 (rope scaling "llama3"), Mistral (a
sliding window shorter than the sequences, and none), each a random tiny model of that
family built here with transformers' own config class, against HF's forward in fp32.

Tolerance (fp32): the fast path's arithmetic is HF's up to summation order (fused Q|K|V
and gate|up matmuls, residuals added inside `addmm`, SDPA over a padded cache, RoPE as a
`bmm`: each within an ulp or so of HF's); measured <= 7e-6 on a logprob here (values of ~1..10), asserted at
2e-5. Greedy tokens are HF generate's exactly.
"""

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

from baton.rollout.embedded import llama
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams

torch.set_num_threads(1)
EOS = 2
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [40]]  # ragged: left padding
TOL = 2e-5
SIZES = dict(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=0.3, eos_token_id=EOS, pad_token_id=0, bos_token_id=1)
MOE = {**SIZES, "num_experts_per_tok": 2, "num_hidden_layers": 3}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # scales the slow frequencies
FAMILIES = {
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SIZES, head_dim=16)),  # 4 x 16 != hidden 32
    "llama3": lambda: LlamaForCausalLM(LlamaConfig(**SIZES, rope_scaling=LLAMA3)),
    "mistral-window": lambda: MistralForCausalLM(MistralConfig(**SIZES, sliding_window=5)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SIZES, sliding_window=None)),
    # mixtures of experts (`baton.rollout.embedded.moe`): 8 experts, top-2; Qwen3-MoE with a dense layer
    # (mlp_only_layers) and without renormalising its top-k, Mixtral renormalising
    "qwen3-moe": lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE, moe_intermediate_size=48, num_experts=8,
                                                            mlp_only_layers=[1], norm_topk_prob=False)),
    "mixtral": lambda: MixtralForCausalLM(MixtralConfig(**MOE, num_local_experts=8, sliding_window=5)),
}


def build(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return FAMILIES[family]().eval()


def reference_logprobs(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """Logprobs of `tokens` after `prompt` from one unpadded full forward of the HF model."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float() / (temperature or 1.0)
    lp = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
    return lp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param, build(request.param)


@pytest.mark.parametrize("static", [False, "fixed"])
def test_logprobs_match_hfs_forward(family, static):
    name, model = family
    engine = EmbeddedEngine(model, static_decode=static)
    assert type(engine.runner).__name__ == "LlamaRunner"
    # 12 new tokens after up to 7: past a window of 5 both in the prefill and in decode
    params = SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=0)
    outs = engine.generate(PROMPTS, params)
    worst = 0.0
    for c in outs:
        ref = reference_logprobs(model, PROMPTS[c.prompt_index], c.token_ids, 0.7)
        worst = max(worst, (torch.tensor(c.logprobs) - ref).abs().max().item())
    assert worst <= TOL, (name, worst)


def test_greedy_tokens_are_hf_generates(family):
    name, model = family
    outs = EmbeddedEngine(model).generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=10))
    for i, c in enumerate(outs):
        ids = torch.tensor([PROMPTS[i]])
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10,
                              pad_token_id=0, eos_token_id=EOS)[0, ids.shape[1]:].tolist()
        assert c.token_ids == want[:len(c.token_ids)] and len(c.token_ids) == len(want), (name, i)


def test_the_family_features_are_exercised():
    """The tests above would pass vacuously if the tiny models lacked what they test."""
    q3 = build("qwen3")
    assert hasattr(q3.model.layers[0].self_attn, "q_norm") and llama.LlamaRunner(q3).qk_norm
    l3 = build("llama3")
    default = LlamaForCausalLM(LlamaConfig(**SIZES)).model.rotary_emb.inv_freq
    assert not torch.equal(l3.model.rotary_emb.inv_freq, default)  # llama3 scaling moved some
    assert llama.LlamaRunner(build("mistral-window")).window == 5
    assert llama.LlamaRunner(build("mistral")).window is None


def test_other_families_and_sliding_layers_run_through_hf():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    windowed = Qwen3ForCausalLM(Qwen3Config(**SIZES, use_sliding_window=True, sliding_window=4,
                                            max_window_layers=1))  # layer 1 slides, layer 0 not
    for model in (gpt2, windowed):
        assert not llama.supports(model)
        assert type(EmbeddedEngine(model).runner).__name__ == "HFRunner"


@pytest.mark.parametrize("name", ["qwen3-moe", "mixtral"])
def test_the_generic_hf_path_generates_a_moe_too(name):
    """`fast=False` (the engine's HF forward, what a model the fast path does not cover runs on)."""
    model = build(name)
    engine = EmbeddedEngine(model, fast=False)
    assert type(engine.runner).__name__ == "HFRunner"
    for c in engine.generate(PROMPTS, SamplingParams(n=2, temperature=0.7, max_new_tokens=8, seed=0)):
        ref = reference_logprobs(model, PROMPTS[c.prompt_index], c.token_ids, 0.7)
        assert (torch.tensor(c.logprobs) - ref).abs().max().item() <= TOL, name
