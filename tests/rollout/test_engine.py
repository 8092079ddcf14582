"""EmbeddedEngine: logprob parity with a full HF forward, greedy parity with HF generate,
stopping, n > 1 order, seeding, weight updates (explicit and colocated in place), sleep/wake."""

import pytest
import torch

from baton.models import build_char_tokenizer, build_tiny_model
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import Completion, Engine, SamplingParams

torch.set_num_threads(1)
EOS = 2
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [40]]  # ragged: left padding


def tiny(family: str, seed: int = 0, **kw) -> torch.nn.Module:
    # a wide init (HF default 0.02) so that greedy output is not "repeat the last token"
    sizes = dict(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, initializer_range=0.3)
    sizes.update(kw)
    return build_tiny_model(None, family=family, seed=seed, **sizes).eval()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request):
    return tiny(request.param, tie_word_embeddings=request.param == "qwen2")


def reference_logprobs(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """Logprobs of `tokens` after `prompt` from one unpadded full forward of the HF model."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()  # [T, V]
    logits = logits / (temperature or 1.0)
    lp = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)  # [R, V]
    return lp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)  # [R]


def assert_logprob_parity(model, prompts, completions: list[Completion], temperature: float) -> None:
    for c in completions:
        ref = reference_logprobs(model, prompts[c.prompt_index], c.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=0)


def hf_greedy(model, prompt: list[int], max_new: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=max_new, pad_token_id=0, eos_token_id=EOS)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf"])
def test_logprobs_match_a_full_forward(model, fast):
    engine = EmbeddedEngine(model, fast=fast)
    assert isinstance(engine, Engine)
    assert type(engine.runner).__name__ == ("LlamaRunner" if fast else "HFRunner")
    params = SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=0)
    outs = engine.generate(PROMPTS, params)
    assert [c.prompt_index for c in outs] == [i for i in range(len(PROMPTS)) for _ in range(3)]
    assert_logprob_parity(model, PROMPTS, outs, 0.7)
    # rows that stop at different steps exercise batch compaction; logprobs must still match
    stop = SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=1, stop_token_ids=list(range(100, 260)))
    outs = engine.generate(PROMPTS, stop)
    assert len({len(c.token_ids) for c in outs}) > 2
    assert_logprob_parity(model, PROMPTS, outs, 1.0)


def test_greedy_equals_hf_generate_and_top_k_1(model):
    engine = EmbeddedEngine(model)
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=10))
    for i, c in enumerate(outs):
        assert c.token_ids == hf_greedy(model, PROMPTS[i], 10)
    assert_logprob_parity(model, PROMPTS, outs, 0.0)  # greedy reports temperature-1 logprobs
    topk1 = engine.generate(PROMPTS, SamplingParams(top_k=1, temperature=1.0, max_new_tokens=10, seed=5))
    assert [c.token_ids for c in topk1] == [c.token_ids for c in outs]


def test_max_batch_tokens_grouping_gives_the_same_result(model):
    params = SamplingParams(n=2, temperature=0, max_new_tokens=6)
    big = EmbeddedEngine(model).generate(PROMPTS, params)
    small = EmbeddedEngine(model, max_batch_tokens=20).generate(PROMPTS, params)  # one prompt per group
    assert [(c.prompt_index, c.token_ids) for c in small] == [(c.prompt_index, c.token_ids) for c in big]


def test_stop_ids_max_tokens_and_finish_reasons():
    model = tiny("qwen2")
    engine = EmbeddedEngine(model)
    free = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))
    assert all(len(c.token_ids) == 8 and c.finish_reason == "length" for c in free)
    # stop on the 3rd greedy token of prompt 0: it is kept, and the row ends there
    target = free[0].token_ids[2]
    if target in free[0].token_ids[:2]:
        pytest.skip("degenerate greedy sequence")
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=[target]))
    assert outs[0].token_ids == free[0].token_ids[:3] and outs[0].finish_reason == "stop"
    for c, f in zip(outs, free):
        assert c.token_ids == f.token_ids[:len(c.token_ids)]
        assert (c.finish_reason == "stop") == (target in f.token_ids)
    # a stop token as the very last allowed token still counts as "stop"
    last = free[0].token_ids[-1]
    if last not in free[0].token_ids[:-1]:
        out = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=[last]))[0]
        assert out.token_ids == free[0].token_ids and out.finish_reason == "stop"
    # EOS from the model's config stops a row unless ignore_eos
    eos_engine = EmbeddedEngine(model, eos_token_ids=[free[1].token_ids[0]])
    out = eos_engine.generate([PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8))[0]
    assert out.token_ids == free[1].token_ids[:1] and out.finish_reason == "stop"


def test_stop_strings_need_a_tokenizer_and_stop_on_text():
    tok = build_char_tokenizer()
    model = tiny("qwen2")
    engine = EmbeddedEngine(model, tok)
    prompt = tok("12+3=")["input_ids"]
    free = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True))[0]
    text = tok.decode(free.token_ids)
    stop = text[3:5]  # a two-character string the greedy output is known to contain
    cut = text.index(stop) + len(stop)
    out = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=12, stop=[stop], ignore_eos=True))[0]
    assert out.finish_reason == "stop" and tok.decode(out.token_ids) == text[:cut]
    with pytest.raises(ValueError, match="tokenizer"):
        EmbeddedEngine(model).generate([prompt], SamplingParams(stop=["x"]))


def test_n_samples_are_prompt_major_and_seeded():
    model = tiny("llama")
    engine = EmbeddedEngine(model)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=10, seed=123, ignore_eos=True)
    a, b = engine.generate(PROMPTS, params), engine.generate(PROMPTS, params)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]  # same seed -> same output
    other = engine.generate(PROMPTS, SamplingParams(**{**params.__dict__, "seed": 124}))
    assert [c.token_ids for c in other] != [c.token_ids for c in a]
    assert [c.prompt_index for c in a] == [i // 4 for i in range(16)]
    assert len({tuple(c.token_ids) for c in a[:4]}) > 1  # samples of one prompt differ
    # each sample continues its own prompt: greedy n=2 equals greedy of that prompt alone
    greedy = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0, max_new_tokens=6))
    for i, p in enumerate(PROMPTS):
        alone = engine.generate([p], SamplingParams(temperature=0, max_new_tokens=6))[0].token_ids
        assert greedy[2 * i].token_ids == greedy[2 * i + 1].token_ids == alone


def test_top_p_and_min_p_sample_only_from_the_kept_set():
    from baton.rollout.embedded.sampling import filter_logits
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))  # [1, 4]
    keep = lambda p: torch.isfinite(filter_logits(logits, p))[0].tolist()  # noqa: E731
    assert keep(SamplingParams(top_p=0.75)) == [True, True, False, False]
    assert keep(SamplingParams(top_p=0.79)) == [True, True, False, False]
    assert keep(SamplingParams(top_p=0.81)) == [True, True, True, False]
    assert keep(SamplingParams(min_p=0.35)) == [True, True, False, False]  # floor 0.175
    assert keep(SamplingParams(min_p=0.7)) == [True, False, False, False]
    assert keep(SamplingParams(top_k=3)) == [True, True, True, False]
    model = tiny("qwen2")
    engine = EmbeddedEngine(model)
    outs = engine.generate(PROMPTS, SamplingParams(top_k=2, max_new_tokens=8, seed=0, ignore_eos=True))
    for c in outs:  # every sampled token is among the 2 most likely at its step
        seq = PROMPTS[c.prompt_index] + c.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0, len(PROMPTS[c.prompt_index]) - 1:-1]  # [R, V]
        top2 = logits.topk(2, dim=-1).indices  # [R, 2]
        assert all(t in row for t, row in zip(c.token_ids, top2.tolist()))


def test_update_weights_changes_outputs_and_checks_names():
    model, other = tiny("qwen2", seed=0), tiny("qwen2", seed=1)
    engine = EmbeddedEngine(model, version=3)
    params = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    before = engine.generate(PROMPTS, params)
    assert all(c.version == 3 for c in before)
    engine.update_weights(other.state_dict().items(), version=4)
    after = engine.generate(PROMPTS, params)
    assert engine.version == 4 and all(c.version == 4 for c in after)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert_logprob_parity(other, PROMPTS, after, 0.0)
    engine.update_weights([("module.model.norm.weight", torch.ones(32))], version=5)  # DDP prefix ok
    with pytest.raises(KeyError, match="model.nope.weight"):
        engine.update_weights([("model.nope.weight", torch.ones(1))], version=6)
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights([("model.norm.weight", torch.ones(3))], version=6)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_colocated_engine_reads_the_trainer_params_in_place(family):
    model = tiny(family)
    engine = EmbeddedEngine(model)
    params = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    before = engine.generate(PROMPTS, params)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)  # one big optimizer step on the module itself
    model.train()
    loss = model(torch.tensor([PROMPTS[0]]), labels=torch.tensor([PROMPTS[0]])).loss
    loss.backward()
    opt.step()
    model.eval()
    after = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert_logprob_parity(model, PROMPTS, after, 0.0)


@pytest.mark.parametrize("mode", ["cache", "offload", "discard"])
def test_sleep_wake_round_trip(mode):
    model = tiny("qwen2")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    engine = EmbeddedEngine(model, sleep_mode=mode)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    before = engine.generate(PROMPTS, params)
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(PROMPTS, params)
    if mode == "discard":
        assert all(p.numel() == 0 for p in model.parameters())
    engine.wake()
    if mode == "discard":
        with pytest.raises(RuntimeError, match="update_weights"):
            engine.generate(PROMPTS, params)
        engine.update_weights(saved.items(), version=1)
    after = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in after] == [c.token_ids for c in before]
    assert not engine.runner.cache  # the KV cache lives only for the duration of a generate


def qkv_back_to_back(model) -> bool:
    attn = model.model.layers[0].self_attn
    return attn.k_proj.weight.data_ptr() == attn.q_proj.weight.data_ptr() + attn.q_proj.weight.nbytes


@pytest.mark.parametrize("mode", ["cache", "discard"])
def test_an_own_copy_lays_itself_out_when_built_and_on_wake(mode):
    """A "discard" engine owns its module: it lays Q|K|V back to back (`fuse_storage`) when built
    and again on wake (which reallocates the storage one parameter at a time), with no worker
    reaching into it; a "cache" engine reads a module it does not own and leaves it as it is."""
    model = tiny("qwen2")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    engine = EmbeddedEngine(model, sleep_mode=mode, fuse_weights=False)
    assert qkv_back_to_back(model) == (mode == "discard")
    engine.sleep()
    engine.wake()
    engine.update_weights(saved.items(), version=1)
    assert qkv_back_to_back(model) == (mode == "discard")
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())


def test_engines_declare_their_optional_members():
    """`Engine`'s optional members have a value on every engine (none probed with getattr):
    the embedded engine offers its module, device, adapters and KV budget; a bare subclass
    has the protocol's 'not offered' values."""
    engine = EmbeddedEngine(tiny("qwen2"))
    assert engine.device.type == "cpu" and engine.batch_budget is not None and engine.adapters == {}
    assert engine.base_url is None and engine.update_weights_from_disk is None and engine.structured_outputs

    class Bare(Engine):
        version = 0

    bare = Bare()
    assert (bare.model, bare.device, bare.base_url, bare.max_model_len, bare.batch_budget) == (None,) * 5
    assert not bare.structured_outputs and not bare.eos_token_ids and not bare.adapters


def test_generic_path_for_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                       eos_token_id=EOS)).eval()
    engine = EmbeddedEngine(model)
    assert type(engine.runner).__name__ == "HFRunner"
    outs = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0.9, max_new_tokens=8, seed=0))
    assert_logprob_parity(model, PROMPTS, outs, 0.9)


def test_inverse_cdf_sampling_follows_the_probabilities():
    from baton.rollout.embedded.sampling import sample_from_probs
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 0.0, 2.0]]).repeat(20000, 1)  # unnormalised ok
    tokens = sample_from_probs(probs, torch.Generator().manual_seed(0)).view(-1, 2)  # [N, 2]
    freq = torch.bincount(tokens[:, 0], minlength=4) / tokens.shape[0]
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.0, 0.3, 0.2]), atol=0.015, rtol=0)
    assert (tokens[:, 1] == 3).all()  # zero-probability tokens are never drawn


def test_max_new_tokens_one_and_empty_prompt():
    engine = EmbeddedEngine(tiny("llama"))
    outs = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=1, seed=0, ignore_eos=True))
    assert all(len(c.token_ids) == len(c.logprobs) == 1 and c.finish_reason == "length" for c in outs)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[]], SamplingParams())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_the_cpu_reference():
    model = tiny("qwen2").cuda()
    outs = EmbeddedEngine(model).generate(PROMPTS, SamplingParams(n=2, temperature=0.8, max_new_tokens=8, seed=0))
    assert_logprob_parity(model.cpu(), PROMPTS, outs, 0.8)
