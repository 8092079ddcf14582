"""What the direction tests observe of one real training step: the batch each production
worker's update receives (after the driver computed rewards, advantages, off-policy
weights) and the model's per-row logprobs just before and just after that update.

The workers' own methods are wrapped (the local backend runs them in this process); the
wrappers only read: every number the update uses comes from the production path, so a
mutant of the driver, an estimator, a loss or a worker moves what these tests see.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from baton import fields as F
from baton.batch import Batch
from baton.workers.actor import ActorWorker
from baton.workers.critic import CriticWorker
from baton.workers.dpo_actor import DPOActorWorker
from baton.workers.sequences import batched_logprobs

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# One step: 4 prompts x 4 samples of at most 4 tokens from a 0.75M-parameter random model.
TINY = ["data.prompts_per_step=4", "data.eval_size=4", "rollout.n=4", "rollout.max_new_tokens=4",
        "actor.micro_batch_size=16", "actor.mini_batch_size=16", "actor.lr_warmup_steps=0",
        "trainer.progress=false", "trainer.steps=1", "trainer.eval_every=0",
        "reward.functions={direction/parity: 1.0}", "placement.backend=local", "placement.world_size=1"]


@dataclass
class Update:
    batch: Batch  # what the worker's update received
    before: torch.Tensor  # [B, R] response logprobs before the update (0 on padding)
    after: torch.Tensor  # [B, R] ... after it

    @property
    def delta_tokens(self) -> torch.Tensor:  # [B, R]
        return self.after - self.before

    @property
    def delta(self) -> torch.Tensor:  # [B] the change of each row's sequence logprob
        return self.delta_tokens.sum(-1)


@dataclass
class CriticUpdate:
    batch: Batch
    before: torch.Tensor  # [B, R] values before the critic's update
    after: torch.Tensor  # [B, R]


@dataclass
class Observed:
    actor: list[Update] = field(default_factory=list)
    critic: list[CriticUpdate] = field(default_factory=list)


def row_logprobs(worker: ActorWorker, batch: Batch) -> torch.Tensor:
    """[B, R] the worker's model's response logprobs (eval mode, no grad), 0 on padding."""
    worker.model.eval()
    with torch.no_grad():
        logp = batched_logprobs(worker.model, batch, 64, worker.temperature)["logprobs"]  # [B, R]
    return (logp * batch[F.RESPONSE_MASK]).double()


def observe(monkeypatch: Any) -> Observed:
    """Wrap ActorWorker.update, DPOActorWorker.update_dpo and CriticWorker.update_critic for
    the test's duration."""
    seen = Observed()
    real_update, real_critic = ActorWorker.update, CriticWorker.update_critic

    @functools.wraps(real_update)
    def update(self: ActorWorker, batch: Batch) -> dict[str, float]:
        before = row_logprobs(self, batch)
        out = real_update(self, batch)
        seen.actor.append(Update(batch, before, row_logprobs(self, batch)))
        return out

    @functools.wraps(real_critic)
    def update_critic(self: CriticWorker, batch: Batch) -> dict[str, float]:
        before = self.compute_values(batch)[F.VALUES]  # the worker's own method, called directly
        out = real_critic(self, batch)
        seen.critic.append(CriticUpdate(batch, before, self.compute_values(batch)[F.VALUES]))
        return out

    @functools.wraps(DPOActorWorker.update_dpo)
    def update_dpo(self: DPOActorWorker, batch: Batch, _real=DPOActorWorker.update_dpo) -> dict[str, float]:
        before = row_logprobs(self, batch)
        out = _real(self, batch)
        seen.actor.append(Update(batch, before, row_logprobs(self, batch)))
        return out

    monkeypatch.setattr(ActorWorker, "update", update)
    monkeypatch.setattr(DPOActorWorker, "update_dpo", update_dpo)
    monkeypatch.setattr(CriticWorker, "update_critic", update_critic)
    monkeypatch.syspath_prepend(str(HERE))
    import direction_rewards  # noqa: F401  (registers direction/parity)
    return seen


def first_token(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] each row's advantage at its first response token (every sequence-level estimator
    gives a row one value on all its tokens)."""
    return adv[:, 0] * (mask[:, 0] > 0)
