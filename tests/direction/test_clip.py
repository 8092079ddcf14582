"""The actor's update clips the PPO ratio at the recipe's bounds, each on its own side
(DAPO's clip-higher: 1 - clip_low below, 1 + clip_high above), through the production
worker (ActorWorker.update with AlgoConfig(clip_low=0.2, clip_high=0.28)).

Hand-worked: the rows' "old" logprobs are set to the trainer's own minus log 1.25 on the
positive-advantage rows (ratio r = 1.25 on each of their tokens) and plus log(4/3) on the
negative ones (r = 0.75). The loss per token is max(-A r, -A clip(r, 1 - 0.2, 1 + 0.28)):
    A > 0, r = 1.25 < 1.28: not clipped        A < 0, r = 0.75 < 0.8: clipped (to 0.8)
so actor/clip_frac (tokens where the clipped term is chosen) is the negative rows' share of
the tokens: 3/8 here. Bounds swapped (0.28 below, 0.2 above): the positive rows clip and the
negative ones do not, 5/8.
"""

from __future__ import annotations

import math

import torch

from baton import fields as F
from baton.algos.config import AlgoConfig
from baton.batch import Batch
from baton.controller import ResourcePool, WorkerGroup
from baton.models.config import ModelConfig
from baton.models.make import make_tiny_checkpoint
from baton.workers.actor import ActorConfig, ActorWorker


def test_the_update_clips_each_side_at_its_own_bound(tmp_path):
    model_dir = str(make_tiny_checkpoint(tmp_path / "tiny", preset="0.75m", seed=3))
    rows, P, R = 8, 4, 5
    g = torch.Generator().manual_seed(0)
    batch = Batch({F.PROMPT_IDS: torch.randint(4, 50, (rows, P), generator=g),
                   F.PROMPT_MASK: torch.ones(rows, P, dtype=torch.long),
                   F.RESPONSE_IDS: torch.randint(4, 50, (rows, R), generator=g),
                   F.RESPONSE_MASK: torch.ones(rows, R, dtype=torch.long)})
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0])  # [B]: 5 positive, 3 negative rows
    actor = WorkerGroup(ResourcePool(1), ActorWorker, ModelConfig(path=model_dir, dtype="float64"),
                        ActorConfig(lr=1e-6, micro_batch_size=rows, grad_clip=1e9),
                        AlgoConfig(clip_low=0.2, clip_high=0.28), temperature=1.0, max_new_tokens=R,
                        total_steps=1, seed=0)
    try:
        trainer = actor.compute_logprobs(batch).get()[F.OLD_LOGPROBS]  # [B, R]
        shift = torch.where(adv > 0, -math.log(1.25), math.log(4 / 3))[:, None]  # [B, 1]
        batch[F.OLD_LOGPROBS] = trainer + shift  # r = pi / pi_old = 1.25 (A > 0), 0.75 (A < 0)
        batch[F.ADVANTAGES] = adv[:, None].expand(rows, R).clone()
        (metrics,) = actor.update(batch)
    finally:
        actor.shutdown()
    assert metrics["actor/clip_frac"] == 3 / 8, metrics["actor/clip_frac"]
    assert abs(metrics["actor/ratio_mean"] - (5 * 1.25 + 3 * 0.75) / 8) < 1e-6
