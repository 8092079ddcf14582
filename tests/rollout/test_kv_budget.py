"""The embedded engine's KV budget (`baton.rollout.embedded.kv_budget`): groups cut by a fixed budget or
by the memory free now (psutil on the CPU); a budget that cuts the prompts into several groups
and one that holds them all give the same greedy tokens, and the default (from memory) gives
the old fixed default's tokens and logprobs for a seed."""

import psutil
import pytest
import torch

from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.embedded.kv_budget import check_budget_options, group_prompts, kv_bytes_per_token, token_budget
from baton.protocol import SamplingParams
from baton.workers.rollout import RolloutConfig
from tests.rollout.conftest import tiny_qwen

PROMPTS = [[5, 6, 7, 8, 9], [12, 13, 14], [14, 15, 16, 17, 18, 19, 20, 21, 22], [40, 41, 42, 43]]


def test_groups_by_hand():
    # by length: #1 (3), #3 (4), #0 (5), #2 (9); n=2, max_new=6, budget 40:
    # [1, 3]: 4 rows x (4 + 6) = 40 fits; + #0: 6 x 11 = 66 > 40; [0, 2]: 4 x 15 = 60 > 40
    assert group_prompts([5, 3, 9, 4], 2, 6, 40) == [[1, 3], [0], [2]]
    assert group_prompts([5, 3, 9, 4], 2, 6, 120) == [[1, 3, 0, 2]]  # 8 x 15 = 120
    # a row's sampling memory counts too when the budget comes from memory: 4 x (10 + 1) > 40
    assert group_prompts([5, 3, 9, 4], 2, 6, 40, row_tokens=1) == [[1], [3], [0], [2]]


def test_token_budget_by_hand():
    # 1e6 bytes free, half of it, 100 bytes a KV token: 5000 tokens; a row's sampler holds
    # 8 fp32 passes over a 10-token vocabulary = 320 bytes = 3.2 -> 4 tokens
    assert token_budget(1_000_000, 0.5, 100, 10) == (5000, 4)


def test_kv_bytes_per_token_from_the_config():
    cfg = tiny_qwen().config  # 2 layers, 2 KV heads of 16 dims
    assert kv_bytes_per_token(cfg, torch.float32) == 2 * 2 * 2 * 16 * 4
    assert kv_bytes_per_token(cfg, torch.bfloat16) == 2 * 2 * 2 * 16 * 2


def test_budget_from_free_memory_on_the_cpu():
    engine = EmbeddedEngine(tiny_qwen())
    budget, row_tokens = engine.batch_budget()
    per_token = kv_bytes_per_token(engine.model.config, torch.float32)
    # psutil's available memory moves a little between the two reads: within 5%
    want = 0.8 * psutil.virtual_memory().available / per_token
    assert 0.95 * want < budget < 1.05 * want
    assert row_tokens == -(-8 * 4 * engine.model.config.vocab_size // per_token)
    assert EmbeddedEngine(tiny_qwen(), max_batch_tokens=99).batch_budget() == (99, 0)


def test_small_and_large_budgets_give_the_same_greedy_tokens():
    model = tiny_qwen()
    greedy = SamplingParams(n=2, temperature=0, max_new_tokens=6)
    small = EmbeddedEngine(model, max_batch_tokens=40)
    out_small = small.generate(PROMPTS, greedy)
    assert small.last_budget == 40  # 3 groups: test_groups_by_hand's prompt lengths
    assert group_prompts([len(p) for p in PROMPTS], 2, 6, 40) == [[1, 3], [0], [2]]
    large = EmbeddedEngine(model)
    out_large = large.generate(PROMPTS, greedy)
    assert large.last_budget > 65536  # this machine's memory holds far more than the old constant
    assert [c.token_ids for c in out_small] == [c.token_ids for c in out_large]
    assert [c.prompt_index for c in out_small] == [c.prompt_index for c in out_large] == [0, 0, 1, 1, 2, 2, 3, 3]
    torch.testing.assert_close(torch.tensor([c.logprobs for c in out_small]),
                               torch.tensor([c.logprobs for c in out_large]), atol=1e-5, rtol=0)


def test_the_memory_budget_gives_the_old_defaults_tokens_for_a_seed():
    """Old default: a fixed 65536 tokens, one group here; the new default sizes from memory
    and also holds them all: the same draws, bit for bit."""
    model = tiny_qwen()
    sampled = SamplingParams(n=3, temperature=0.8, top_p=0.9, max_new_tokens=8, seed=7)
    old = EmbeddedEngine(model, max_batch_tokens=65536).generate(PROMPTS, sampled)
    new = EmbeddedEngine(model).generate(PROMPTS, sampled)
    assert [(c.token_ids, c.logprobs) for c in new] == [(c.token_ids, c.logprobs) for c in old]


@pytest.mark.parametrize("kw, msg", [(dict(max_batch_tokens=10, memory_fraction=0.5), "not both"),
                                     (dict(memory_fraction=1.5), r"in \(0, 1\]"),
                                     (dict(max_batch_tokens=0), ">= 1")])
def test_bad_budget_options_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        check_budget_options(kw.get("max_batch_tokens"), kw.get("memory_fraction"))
    with pytest.raises(ValueError, match=msg):
        RolloutConfig(**kw).check()
    with pytest.raises(ValueError, match="rollout.engine=vllm sizes its own"):
        RolloutConfig(engine="vllm", memory_fraction=0.5).check()
