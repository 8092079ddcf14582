"""The actor learns the right way: one update on a fixed batch raises the logprobs of rows
with positive advantage and lowers those of rows with negative advantage. (A flipped sign
or advantages lost on the way to the loss make this fail.)"""

import math

import torch

from baton import fields as F
from baton.algos.config import AlgoConfig
from baton.batch import Batch
from baton.controller import ResourcePool, WorkerGroup
from baton.models.config import ModelConfig
from baton.models.make import make_tiny_checkpoint
from baton.workers.actor import ActorConfig, ActorWorker


def test_update_moves_logprobs_with_the_sign_of_the_advantage(tmp_path):
    model_dir = str(make_tiny_checkpoint(tmp_path / "tiny", preset="0.75m", seed=3))
    rows, P, R = 8, 4, 5
    g = torch.Generator().manual_seed(0)
    adv = torch.tensor([1.0, -1.0] * (rows // 2))  # [B]: alternate so prompts repeat across signs
    batch = Batch({F.PROMPT_IDS: torch.randint(4, 50, (rows, P), generator=g),
                   F.PROMPT_MASK: torch.ones(rows, P, dtype=torch.long),
                   F.RESPONSE_IDS: torch.randint(4, 50, (rows, R), generator=g),
                   F.RESPONSE_MASK: torch.ones(rows, R, dtype=torch.long)})
    actor = WorkerGroup(ResourcePool(1), ActorWorker, ModelConfig(path=model_dir),
                        ActorConfig(lr=1e-3, micro_batch_size=rows, grad_clip=1e9), AlgoConfig(),
                        temperature=1.0, max_new_tokens=R, total_steps=1, seed=0)
    try:
        before = actor.compute_logprobs(batch).get()[F.OLD_LOGPROBS]  # [B, R]
        batch[F.OLD_LOGPROBS] = before
        batch[F.ADVANTAGES] = adv[:, None].expand(rows, R).clone()
        actor.update(batch)
        after = actor.compute_logprobs(batch).get()[F.OLD_LOGPROBS]  # [B, R]
    finally:
        actor.shutdown()
    change = (after - before).sum(-1)  # [B]: sequence logprob change
    assert (change[adv > 0] > 0).all(), change
    assert (change[adv < 0] < 0).all(), change


def test_update_measures_the_engine_mismatch_on_its_first_forward(tmp_path):
    """rollout/logprob_mismatch_kl comes from the update's first mini-batch (the weights the
    rows are scored against): k3 = r - 1 - log r per token with r = pi / mu, masked mean.
    Behaviour logprobs that are the trainer's minus 0.5 on every real token give r = e^0.5
    on each: k3 = e^0.5 - 1.5 exactly, whatever the later mini-batches do to the weights."""
    model_dir = str(make_tiny_checkpoint(tmp_path / "tiny", preset="0.75m", seed=3))
    rows, P, R = 8, 4, 5
    g = torch.Generator().manual_seed(1)
    batch = Batch({F.PROMPT_IDS: torch.randint(4, 50, (rows, P), generator=g),
                   F.PROMPT_MASK: torch.ones(rows, P, dtype=torch.long),
                   F.RESPONSE_IDS: torch.randint(4, 50, (rows, R), generator=g),
                   F.RESPONSE_MASK: torch.ones(rows, R, dtype=torch.long)})
    batch[F.RESPONSE_MASK][:, -1] = 0  # a padded last token: not counted, whatever its logprob
    actor = WorkerGroup(ResourcePool(1), ActorWorker, ModelConfig(path=model_dir, dtype="float64"),
                        ActorConfig(lr=1e-2, micro_batch_size=2, mini_batch_size=4, grad_clip=1e9),
                        AlgoConfig(), temperature=1.0, max_new_tokens=R, total_steps=1, seed=0)
    try:
        trainer = actor.compute_logprobs(batch).get()[F.OLD_LOGPROBS]  # [B, R]
        batch[F.OLD_LOGPROBS] = trainer
        batch[F.ROLLOUT_LOGPROBS] = torch.where(batch[F.RESPONSE_MASK].bool(), trainer - 0.5, trainer + 7.0)
        batch[F.ADVANTAGES] = torch.randn(rows, 1, generator=g).expand(rows, R).clone()
        metrics = actor.update(batch)[0]
    finally:
        actor.shutdown()
    assert metrics["actor/grad_norm"] > 0  # two optimizer steps really moved the weights
    expected = math.exp(0.5) - 1.5
    # the ratio is formed in float32 (off_policy._ratio): ~1e-7 relative
    assert abs(metrics["rollout/logprob_mismatch_kl"] - expected) < 1e-6, metrics
