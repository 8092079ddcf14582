"""Delta sync (issue 49 part 5): after the first push, the broadcast and checkpoint transports
send only the tensors whose digest changed; the engine that got deltas is byte for byte the
engine that got the whole model every time; a receiver at another version gets the whole
model, and so does one that serves the version last pushed with other weights; a delta on
weights the receiver does not hold is refused by the receiver."""

from __future__ import annotations

import pytest
import torch

from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.remote import RemoteEngine, RemoteEngineError
from baton.sync import BroadcastSync, CheckpointSync, WeightReceiver
from baton.sync.checkpoint import save_safetensors_atomic
from baton.sync.verify import held_exactly

FROZEN = "model.embed_tokens.weight"  # tied with the LM head: most of the tiny model's bytes


def train_step(model: torch.nn.Module, seed: int, frozen: tuple[str, ...] = (FROZEN,)) -> None:
    """Stand-in for an optimizer step that leaves `frozen` as it is (frozen embeddings)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in frozen:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


def holds(engine: EmbeddedEngine, model: torch.nn.Module) -> bool:
    return held_exactly(dict(engine.model.named_parameters()), model.named_parameters())[0]


def transport(kind: str, engines: list, tmp_path, delta: bool):
    if kind == "broadcast":
        return BroadcastSync([e if isinstance(e, RemoteEngine) else WeightReceiver(e) for e in engines],
                             bucket_mb=0.02, timeout_s=60, delta=delta)
    return CheckpointSync(engines, directory=tmp_path / ("delta" if delta else "full"), delta=delta)


@pytest.mark.parametrize("kind", ["broadcast", "checkpoint"])
def test_a_delta_sync_leaves_the_engine_byte_identical_to_a_full_sync(kind, tiny_qwen, start_server, sync_tokenizer,
                                                                       tmp_path):
    trainer = tiny_qwen(1)
    url, served = start_server()  # gets deltas, over HTTP
    whole = EmbeddedEngine(tiny_qwen(0), sync_tokenizer)  # gets the whole model every push
    delta_sync, full_sync = transport(kind, [RemoteEngine(url)], tmp_path, True), transport(kind, [whole], tmp_path, False)
    every = sum(p.numel() * p.element_size() for p in trainer.parameters())
    frozen = trainer.get_parameter(FROZEN).numel() * 4
    try:
        moved = []
        for version in (1, 2, 3):
            if version > 1:
                train_step(trainer, version)
            delta_sync.push(trainer.named_parameters(), version)
            full_sync.push(trainer.named_parameters(), version)
            moved.append(delta_sync.last["sync/bytes"])
            assert full_sync.last["sync/bytes"] == every
            assert served.version == whole.version == version
            assert holds(served, trainer) and holds(whole, trainer)  # both: the trainer's bytes
        assert moved == [every, every - frozen, every - frozen], moved  # first whole, then what changed
    finally:
        delta_sync.close()
        full_sync.close()


def test_a_receiver_at_another_version_gets_the_whole_model(tiny_qwen, start_server, sync_tokenizer, tmp_path):
    trainer = tiny_qwen(1)
    url, served = start_server()
    local = EmbeddedEngine(tiny_qwen(0), sync_tokenizer)
    sync = BroadcastSync([RemoteEngine(url), WeightReceiver(local)], bucket_mb=0.02, timeout_s=60)
    every = sum(p.numel() * p.element_size() for p in trainer.parameters())
    try:
        sync.push(trainer.named_parameters(), 1)
        train_step(trainer, 2)
        sync.push(trainer.named_parameters(), 2)
        assert sync.last["sync/bytes"] < every
        # someone else loads other weights into the server as version 7: its version no longer
        # says it holds what this trainer sent
        CheckpointSync([RemoteEngine(url)], directory=tmp_path, delta=False).push(tiny_qwen(5).named_parameters(), 7)
        train_step(trainer, 3)
        sync.push(trainer.named_parameters(), 3)
        assert sync.last["sync/bytes"] == every  # the whole model, to every engine of the group
        assert holds(served, trainer) and holds(local, trainer)
        # ... and as version 3, the version this trainer last pushed (a restarted server that
        # loaded other weights under the same number): the version agrees, the weights do not
        CheckpointSync([RemoteEngine(url)], directory=tmp_path, delta=False).push(tiny_qwen(6).named_parameters(), 3)
        assert served.version == 3 and not holds(served, trainer)
        train_step(trainer, 5)
        sync.push(trainer.named_parameters(), 4)
        assert sync.last["sync/bytes"] == every
        assert holds(served, trainer) and holds(local, trainer)
        train_step(trainer, 4)
        sync.push(trainer.named_parameters(), 5)
        assert sync.last["sync/bytes"] < every and holds(served, trainer) and holds(local, trainer)
    finally:
        sync.close()


def test_the_receiver_refuses_a_delta_on_a_version_it_does_not_serve(tiny_qwen, start_server, tmp_path):
    url, served = start_server()
    trainer = tiny_qwen(1)
    CheckpointSync([RemoteEngine(url)], directory=tmp_path / "a").push(trainer.named_parameters(), 3)
    before = {n: p.detach().clone() for n, p in served.model.named_parameters()}
    path = save_safetensors_atomic([("model.norm.weight", torch.zeros(64))], tmp_path / "delta.safetensors")
    with pytest.raises(RemoteEngineError) as err:
        RemoteEngine(url).update_weights_from_disk(str(path), 4, base_weights="0123456789abcdef")
    assert "-> 409" in str(err.value) and "a delta on weights 0123456789abcdef cannot be applied: this engine " \
        "holds " in str(err.value) and "still serving version 3" in str(err.value), str(err.value)
    assert served.version == 3 and held_exactly(before, served.model.named_parameters())[0]
    local = EmbeddedEngine(tiny_qwen(0), None)
    receiver_sync = CheckpointSync([local], directory=tmp_path / "b")
    receiver_sync.push(trainer.named_parameters(), 3)
    local.version = 5  # moved on by someone else: the next push must be whole, not a delta on 3
    train_step(trainer, 9)
    receiver_sync.push(trainer.named_parameters(), 6)
    assert receiver_sync.last["sync/bytes"] == sum(p.numel() * 4 for p in trainer.parameters())
    assert holds(local, trainer)
