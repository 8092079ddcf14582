"""The GRPO driver loop (and its PPO-family relatives chosen by `algo.*` names).

    baton train recipes/grpo_arithmetic.yaml trainer.steps=50

One step, top to bottom, as the controller sees it:
    prompts  --rollout.generate-->        rows (n per prompt, behaviour logprobs, version)
    rows     --reward.compute_rewards-->            rewards       } futures, concurrent when
    rows     --reference.compute_ref_logprobs-->    ref logprobs  } the roles sit on different
    rows     --actor.compute_logprobs-->            old logprobs  } pools (ref: kl_coef > 0;
                                                                    old: recompute_old_logprobs)
    rows     --ADVANTAGES[algo.advantage]--> advantages (a pure function, here in the driver)
    rows     --actor.update-->            new weights, metrics
    actor    --rollout.sync_weights-->    the engine samples with version step+1

Departures from the GRPO paper: one optimizer step per `actor.mini_batch_size` rows (the
paper's "mu" iterations are `actor.epochs`); the KL term is optional (off by default, as in
DAPO / Dr. GRPO); clip-higher (DAPO) is on by default (clip_high=0.28).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from baton import fields as F
from baton.algos import OFF_POLICY, compute_advantages
from baton.algos.token_rewards import token_level_rewards
from baton.batch import Batch
from baton.metrics import Timer, write_report
from baton.trainers.grpo_config import GRPOConfig
from baton.trainers.placement import build_roles
from baton.trainers.run import (NonFiniteGuard, StepEnd, close_run, evaluate, metrics_logger, open_run,
                                save_checkpoint)
from baton.trainers.run_state import RunState
from baton.trainers.async_source import rollout_source
from baton.trainers.api_source import ApiSource


def step_metrics(batch: Batch, update: list[dict[str, float]], version: int) -> dict[str, Any]:
    """What one step logs about its rollouts and its update (means over data-parallel ranks)."""
    rewards, mask = batch[F.REWARDS], batch[F.RESPONSE_MASK].float()
    lengths = mask.sum(1)
    m: dict[str, Any] = {
        "reward/mean": rewards.mean().item(), "reward/std": rewards.std().item(),
        "response/length_mean": lengths.mean().item(),
        "response/truncated": sum(r == "length" for r in batch[F.FINISH_REASON]) / len(batch),
        "rollout/policy_age": (version - batch[F.POLICY_VERSION].float()).mean().item(),
        "rollout/tokens": int(lengths.sum().item()),
    }
    for k in batch.tensors:
        if k.startswith("reward/"):
            m[k] = batch[k].mean().item()
    for k in batch.tensors:  # reward calls that raised / hung / were not finite (scored 0)
        if k.startswith("reward_"):
            m[f"reward/{k.removeprefix('reward_')}"] = int(batch[k].sum())
    for k in update[0]:
        m[k] = sum(u[k] for u in update) / len(update)
    return m


def check_sync(parity: list[float], step: int, tol: float = 1e-4) -> None:
    """Fail loudly if an engine samples from weights other than the trainer's."""
    if max(parity) > tol:
        raise RuntimeError(f"weight sync check failed after step {step}: engine and trainer "
                           f"logprobs differ by {max(parity):.2e} (> {tol:g}) on a fixed prompt")


def train(cfg: GRPOConfig) -> dict[str, float]:
    t = cfg.trainer
    torch.manual_seed(t.seed)
    run = open_run(cfg)  # locked; refuses a finished run's dir; config.yaml written
    roles: dict = {}
    try:
        state = RunState.fresh(cfg.data)
        roles = build_roles(cfg, probe_prompt=state.eval_rows[0]["prompt"])
        actor, rollout, reward, ref = roles["actor"], roles["rollout"], roles["reward"], roles.get("reference")
        source = (ApiSource(cfg, actor, state, probe_prompt=state.eval_rows[0]["prompt"])  # data.source=api:
                  if cfg.data.source == "api" else rollout_source(cfg, roles, state))  # or trainer.mode
        if run.resume_from:
            state.restore(actor.load_checkpoint(str(run.resume_from))[0])
            source.load_state_dict(state.source)
            source.weights_updated(state.step)
        log = metrics_logger(run, t, start_step=state.step)
        end = StepEnd(t, log, NonFiniteGuard(t.max_nonfinite_steps), lambda: evaluate(rollout, state.eval_rows))
        # the trainer's own (proximal) logprobs: PPO's "old" ones, and what off-policy rows'
        # behaviour logprobs are weighed against (algo.off_policy, baton.algos.off_policy)
        proximal = cfg.algo.recompute_old_logprobs or cfg.algo.off_policy != "none"
        try:
            if state.step == 0:
                state.first_eval = evaluate(rollout, state.eval_rows)
                log.log(0, state.first_eval)
            while state.step < t.steps:
                step, timer, t0 = state.step + 1, Timer(), time.perf_counter()
                with timer("rollout"):
                    batch = source.rows(step)
                with timer("score"):  # rewards, reference and old logprobs: concurrent on split pools
                    pending = [] if F.REWARDS in batch else [reward.compute_rewards(batch)]  # scored by the source?
                    if ref is not None:
                        pending.append(ref.compute_ref_logprobs(batch))
                    if proximal:
                        pending.append(actor.compute_logprobs(batch))
                    else:  # the engine's logprobs equal the trainer's (tested), so skip a forward
                        batch[F.OLD_LOGPROBS] = batch[F.ROLLOUT_LOGPROBS]
                    for future in pending:
                        batch = batch.union(future.get())
                batch[F.ADVANTAGES], _ = compute_advantages(
                    cfg.algo.advantage, scores=batch[F.REWARDS], response_mask=batch[F.RESPONSE_MASK],
                    group_size=cfg.rollout.n,
                    token_rewards=token_level_rewards(batch[F.REWARDS], batch[F.RESPONSE_MASK]))
                correction = {}
                if proximal:  # mu (the engine; older under trainer.mode async) vs the trainer's pi_prox
                    weights, stats = OFF_POLICY[cfg.algo.off_policy](
                        batch[F.OLD_LOGPROBS], batch[F.ROLLOUT_LOGPROBS], batch[F.RESPONSE_MASK],
                        cap=cfg.algo.off_policy_cap)
                    correction = {k: v.item() for k, v in stats.items()}
                    if weights is not None:  # w * loss(A) = loss(w * A): see baton.algos.off_policy
                        batch[F.ADVANTAGES] = batch[F.ADVANTAGES] * weights
                with timer("update"):
                    update = actor.update(batch)  # skips optimizer steps whose loss/grad is not finite
                with timer("sync"):
                    parity = source.weights_updated(step, check=t.check_weight_sync)
                if t.check_weight_sync:
                    check_sync(parity, step)
                state.step = step

                def save() -> None:  # the source's staleness state (rows sampled ahead) too
                    state.source = source.state_dict()
                    save_checkpoint(actor, run, t, step, state.to_dict())

                end(step, {**correction, **step_metrics(batch, update, version=step - 1)}, timer, t0, save=save)
        finally:
            log.close()
            source.close()
    finally:
        close_run(run, roles, cfg.placement.backend)
    write_report(run.path)
    return {**{f"start/{k}": v for k, v in (state.first_eval or {}).items()}, **end.final_eval}
