"""The actor learns the right way: one update on a fixed batch raises the logprobs of rows
with positive advantage and lowers those of rows with negative advantage. (A flipped sign
or advantages lost on the way to the loss make this fail.)"""

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
