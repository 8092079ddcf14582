"""`baton serve`'s in-flight generations share one fused copy of the matmul weights
(`EmbeddedEngine(fuse_weights=True)`, `LlamaRunner.pack`): a paused generation keeps its
KV cache, not a copy of the model. Regression: each paused generation held its own fused
copy (4 paused generations: 4.0x the model's bytes; at the server's 8, a 7B bf16 model
needed ~120 GB). A weight update, a sleep, or the last generation ending drops the copy:
the next generation fuses the weights it then finds."""

from __future__ import annotations

import pytest
import torch

from baton.models import build_tiny_model
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams

torch.set_num_threads(1)
PROMPT = [[5, 6]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)


def tiny(seed: int = 0) -> torch.nn.Module:
    return build_tiny_model(None, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, seed=seed,
                            initializer_range=0.3).eval()


def model_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def held_bytes(gens, model) -> int:
    """Bytes of the distinct storages the paused generations hold, the model's own
    parameters (read in place) left out: fused weights, KV caches, position tables."""
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def walk(v) -> None:
        if isinstance(v, torch.Tensor):
            s = v.untyped_storage()
            if s.data_ptr() not in own:
                seen[s.data_ptr()] = s.nbytes()
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    for g in gens:
        walk(g._state)
    return sum(seen.values())


def paused(engine: EmbeddedEngine, k: int) -> list:
    gens = [engine.start_generation(PROMPT, GREEDY) for _ in range(k)]
    for g in gens:
        assert not g.advance(2)  # prefill + a decode step, then put aside
    return gens


@pytest.mark.parametrize("k", [1, 4])
def test_paused_generations_hold_one_fused_copy(k):
    model = tiny()
    gens = paused(EmbeddedEngine(model), k)
    ratio = held_bytes(gens, model) / model_bytes(model)  # KV caches here: < 1% of the model
    assert 0.5 < ratio < 1.1, ratio  # one fused copy (the embedding is read in place), however many wait


def test_a_weight_update_gives_later_generations_the_new_weights():
    """A generation started after an update fuses the new weights, though one started before
    is still paused (what that one samples is undefined: the server lets running
    generations finish before an update, `Batcher.paused`, so none spans one)."""
    model, other = tiny(0), tiny(1)
    want_new = EmbeddedEngine(tiny(1)).generate(PROMPT, GREEDY)[0].token_ids
    assert want_new != EmbeddedEngine(tiny(0)).generate(PROMPT, GREEDY)[0].token_ids
    engine = EmbeddedEngine(model)
    old = paused(engine, 1)[0]
    engine.update_weights(other.named_parameters(), version=1)
    old.advance(1)  # its runner state put back and aside again: the dropped copy stays dropped
    new = engine.start_generation(PROMPT, GREEDY)
    new.advance()
    assert new.result[0].token_ids == want_new
    old.close()


def test_the_copy_is_dropped_when_no_generation_is_in_flight():
    """A colocated trainer's optimizer step changes the module in place, with no update call:
    the next `generate` must fuse afresh, and nothing is held between calls."""
    model = tiny(0)
    engine = EmbeddedEngine(model)
    gens = paused(engine, 2)
    for g in gens:
        g.advance()
    gens[0].close()  # closing a finished generation changes nothing
    with torch.no_grad():
        for p, q in zip(model.parameters(), tiny(1).parameters()):
            p.copy_(q)
    assert engine.generate(PROMPT, GREEDY)[0].token_ids == EmbeddedEngine(tiny(1)).generate(PROMPT, GREEDY)[0].token_ids
    assert held_bytes([engine.start_generation(PROMPT, GREEDY)], model) == 0  # not started: nothing packed
