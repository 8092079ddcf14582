"""Tinker code and baton's trainer compute the same step: an RL step written against the SDK
(importance-sampled PPO rows, advantages scaled by 1 / tokens because Tinker's losses are sums)
and baton's actor update (`ActorWorker.update`, the update `baton train` runs, with the same
LoRA init, ppo_clip and token-mean) give the same first-step loss and gradient norm, fp32.
Skipped without the SDK (`.[tinker]`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from baton import fields as F  # noqa: E402
from baton.batch import Batch  # noqa: E402
from baton.config import load_config  # noqa: E402
from baton.controller import ResourcePool, WorkerGroup  # noqa: E402
from baton.tinker.trainee import LORA_ALPHA  # noqa: E402
from baton.trainers.ppo_config import PPOConfig  # noqa: E402
from baton.workers.actor import ActorWorker  # noqa: E402
from tests.tinker_api.conftest import KEY, NAME  # noqa: E402

ROWS, P, R = 8, 5, 6


def rows() -> Batch:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(ROWS, R, dtype=torch.long)
    for i in range(ROWS):
        mask[i, 1 + i % R:] = 0
    return Batch({F.PROMPT_IDS: torch.randint(4, 200, (ROWS, P), generator=g),
                  F.PROMPT_MASK: torch.ones(ROWS, P, dtype=torch.long),
                  F.RESPONSE_IDS: torch.randint(4, 200, (ROWS, R), generator=g), F.RESPONSE_MASK: mask,
                  F.OLD_LOGPROBS: -3 - 2 * torch.rand(ROWS, R, generator=g),  # ratios far from 1: some clip
                  F.ADVANTAGES: torch.randn(ROWS, 1, generator=g).expand(ROWS, R).clone()})


def baton_step(model_dir: str, batch: Batch) -> dict[str, float]:
    cfg = load_config(PPOConfig, overrides=[
        f"model.path={model_dir}", "data.prompts_per_step=2", "rollout.n=4", "model.lora.rank=8",
        f"model.lora.alpha={LORA_ALPHA}", "algo.kl_coef=0", "algo.entropy_coef=0", "algo.policy_loss=ppo_clip",
        "algo.clip_low=0.2", "algo.clip_high=0.2", "algo.loss_agg=token-mean", "actor.grad_clip=1e9"])
    group = WorkerGroup(ResourcePool(1), ActorWorker, cfg.model, cfg.actor, cfg.algo, temperature=1.0,
                        max_new_tokens=R, total_steps=1, seed=0)
    try:
        out = group.update(batch)
        return out[0] if isinstance(out, list) else out
    finally:
        group.shutdown()


def sdk_step(url: str, batch: Batch) -> tuple[float, float]:
    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    tc = service.create_lora_training_client(base_model=NAME, rank=8, seed=0, train_unembed=False).result()
    mask = batch[F.RESPONSE_MASK]
    n_tokens = float(mask.sum())
    data = []
    for i in range(ROWS):
        k = int(mask[i].sum())
        full = batch[F.PROMPT_IDS][i].tolist() + batch[F.RESPONSE_IDS][i, :k].tolist()
        pad = [0.0] * (P - 1)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={
            "target_tokens": np.array(full[1:]),
            "logprobs": np.array(pad + batch[F.OLD_LOGPROBS][i, :k].tolist(), np.float32),
            "advantages": np.array(pad + (batch[F.ADVANTAGES][i, :k] / n_tokens).tolist(), np.float32)}))
    loss = tc.forward_backward(data, "ppo").result().metrics["loss:sum"]
    step = tc.optim_step(types.AdamParams(learning_rate=1e-3)).result().metrics
    return loss, step["optim/grad_norm"]


def test_first_step_loss_and_grad_norm_equal_batons(server, tiny_dir):
    batch = rows()
    want = baton_step(str(tiny_dir), batch)
    loss, norm = sdk_step(server.url, batch)
    assert loss == pytest.approx(want["actor/loss"], rel=1e-5, abs=1e-6)
    assert norm == pytest.approx(want["actor/grad_norm"], rel=1e-4)
    assert want["actor/clip_frac"] > 0  # the clip was in play
