"""Fixtures for `baton tinker`: a tiny model dir, the server on a free loopback port (a real
uvicorn in a background thread), and the golden numbers baton's own loss code gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from baton.models.make import make_tiny_checkpoint
from baton.rollout.server import ServerThread
from baton.tinker.app import build_app, load_service

torch.set_num_threads(1)  # the machine is shared; tiny models gain nothing from more
KEY = "tml-test-key"
NAME = "baton/tiny"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0)


@pytest.fixture(scope="session")
def server(tiny_dir, tmp_path_factory):
    service = load_service(tiny_dir, model_name=NAME, state_dir=tmp_path_factory.mktemp("state"),
                           max_models=16)
    thread = ServerThread(build_app(service, api_key=KEY, poll_s=5.0))
    yield thread
    thread.stop()


def base_logprobs(model_dir, tokens: list[int], targets: list[int]) -> torch.Tensor:
    """The base model's logprobs of `targets` after each prefix of `tokens` (fp32): a new LoRA
    starts at B = 0, so they are the training model's before its first step."""
    from baton.algos.logprobs import logprobs_from_logits
    from baton.models.load import load_model

    model = load_model(str(model_dir))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0]
    return logprobs_from_logits(logits, torch.tensor(targets))


def golden_rows(model_dir):
    """Two RL rows (tokens, targets, sampling logprobs, advantages) whose sampling logprobs are
    off the model's by +-0.4, so PPO's clip is active on some tokens, and the loss sums baton's
    `ppo_clip` / `vanilla` losses give on them."""
    from baton.algos.policy_loss import POLICY_LOSSES

    rng = np.random.default_rng(0)
    rows, expect = [], {"ppo": 0.0, "importance_sampling": 0.0}
    for length in (9, 6):
        seq = rng.integers(3, 200, size=length + 1).tolist()
        tokens, targets = seq[:-1], seq[1:]
        lp = base_logprobs(model_dir, tokens, targets)
        old = (lp + torch.tensor(rng.choice([-0.4, 0.4], size=length))).float()
        adv = torch.tensor(rng.normal(size=length)).float()
        rows.append((tokens, targets, old.numpy(), adv.numpy()))
        ones = torch.ones(1, length)
        args = dict(logprobs=lp[None], old_logprobs=old[None], advantages=adv[None], response_mask=ones)
        expect["ppo"] += float(POLICY_LOSSES["ppo_clip"](**args, clip_low=0.2, clip_high=0.2)[0].sum())
        expect["importance_sampling"] += float(POLICY_LOSSES["vanilla"](**args)[0].sum())
    return rows, expect
