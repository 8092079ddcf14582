"""One optimizer config (`baton.workers.optim.OptimConfig`) for every trained role: the actor's
and the critic's sections, SFT's and the reward model's `optim:` read, check and build it the
same way, each with its own defaults."""

import pytest
import torch

from baton.config import ConfigError, load_config
from baton.trainers.reward_model import RMConfig
from baton.trainers.sft import SFTConfig
from baton.workers.actor import ActorConfig
from baton.workers.critic import CriticConfig
from baton.workers.optim import OptimConfig

SECTIONS = {"actor": ActorConfig(), "critic": CriticConfig(), "sft": SFTConfig().optim, "rm": RMConfig().optim}


@pytest.mark.parametrize("role", sorted(SECTIONS))
def test_every_trained_role_has_the_one_optimizer_config(role):
    assert isinstance(SECTIONS[role], OptimConfig)


def test_each_role_keeps_its_defaults():
    got = {role: (c.lr, c.lr_warmup_steps, c.lr_schedule, c.min_lr_ratio, list(c.betas))
           for role, c in SECTIONS.items()}
    assert got == {"actor": (1e-5, 0, "constant", 0.0, [0.9, 0.99]), "critic": (1e-4, 0, "constant", 0.0, [0.9, 0.99]),
                   "sft": (3e-3, 50, "cosine", 0.1, [0.9, 0.98]), "rm": (1e-4, 10, "cosine", 0.1, [0.9, 0.99])}


@pytest.mark.parametrize("cls", [SFTConfig, RMConfig])
def test_a_decay_floor_above_one_is_refused_for_every_role(cls):
    """SFT and the reward model checked lr, grad_clip and the warm-up but let min_lr_ratio=2
    through (an LR that rose during the decay); the shared check refuses it."""
    with pytest.raises(ConfigError, match="min_lr_ratio in"):
        load_config(cls, overrides=["optim.min_lr_ratio=2"])


def test_the_sft_schedule_is_the_configured_one():
    """SFT's `optim.lr_schedule` (it was always cosine) reaches its scheduler."""
    cfg = load_config(SFTConfig, overrides=["optim.lr_schedule=linear", "optim.lr_warmup_steps=0",
                                            "optim.min_lr_ratio=0"])
    optim, sched = cfg.optim.build(torch.nn.Linear(2, 2), total_steps=4)
    factors = [sched.lr_lambdas[0](s) for s in range(4)]
    assert factors == [1.0, 0.75, 0.5, 0.25]  # linear from 1 to the floor 0 over the 4 steps
