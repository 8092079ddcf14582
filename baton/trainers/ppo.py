"""The PPO-family driver: PPO with a critic and GAE, and the critic-less estimators (GRPO,
RLOO, ReMax, REINFORCE++, ...) with GSPO, DAPO and truncated-IS options, chosen by config.

    baton train recipes/ppo_arithmetic.yaml [trainer.steps=N placement.backend=ray ...]

One step, top to bottom, as the controller sees it:
    prompts --rollout.generate-->          rows (n per prompt, behaviour logprobs, version;
                                           + one greedy response per prompt for ReMax)
            (DAPO dynamic sampling: score, drop groups with equal rewards, sample more
             prompts until the batch is full, at most algo.dynamic_sampling_max_rounds more)
    rows    --reward.compute_rewards-->              rewards          } futures, all in flight
    rows    --reward_model.compute_rm_scores-->      reward/model     } at once: concurrent
    rows    --reference.compute_ref_logprobs-->      ref logprobs     } when the roles sit on
    rows    --critic.compute_values-->               values           } different pools
    rows    --actor.compute_logprobs-->              old logprobs     }
    scores  --token_level_rewards (+ -beta KL_t, algo.kl_in_reward)--> token rewards
    tokens  --ADVANTAGES[algo.advantage]-->          advantages, returns (GAE: returns =
                                                     A + V before whitening)
    rows    --actor.update  ||  critic.update_critic-->   both launched, then both awaited:
                                                     they overlap on split pools
    actor   --rollout.sync_weights-->                the engine samples with the new version

The calls of every role are timestamped per rank by the hosts and appended to
`RUN_DIR/timeline.jsonl` after each step; `timeline/update_overlap` is the fraction of the
shorter update that ran while the other did (see baton.trainers.timeline).

Departures: truncated IS multiplies the advantages by w_t = min(pi_old/mu, cap) instead of
the per-token loss: every policy loss here (ppo_clip with or without dual clip, vanilla,
gspo) is positively homogeneous in the advantage (loss(wA) = w loss(A) for w > 0), so this
is the same loss and gradient, and it leaves the KL and entropy terms unweighted as verl
does. The critic trains alone for `critic.pretrain_steps` steps (the actor and the engine keep
their weights, so those steps' rollouts come from the initial policy). DAPO's dynamic
sampling fills a batch it could not fill within the cap with dropped (zero-signal) groups,
so every step has the configured size.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from baton import fields as F
from baton.algos import (KL_CONTROLLERS, compute_advantages, dynamic_sampling_filter,
                         explained_variance, kl_in_reward, masked_mean, overlong_penalty,
                         token_level_rewards, truncated_is_weights)
from baton.batch import Batch
from baton.metrics import Timer, write_report
from baton.runs.checkpoints import CHECKPOINTS_DIR, checkpoint_step, list_checkpoints
from baton.runs.fsutil import unused_sibling
from baton.trainers import timeline
from baton.trainers.grpo import check_sync, step_metrics
from baton.trainers.placement import build_roles
from baton.trainers.ppo_config import PPOConfig, estimator_reads
from baton.trainers.run import (NonFiniteGuard, StepEnd, close_run, evaluate, metrics_logger, open_run,
                                save_checkpoint)
from baton.trainers.run_state import RunState
from baton.workers.reward_model import RM_SCORE
from baton.workers.rollout import BASELINE_COMPLETION

CRITIC_PREFIX = "critic_step_"  # checkpoints/critic_step_N, written before the actor's step_N


class CriticAwareGuard(NonFiniteGuard):
    """The run's non-finite guard, also counting steps whose critic loss / gradient was not
    finite (the critic skipped those optimizer steps, as the actor does)."""

    KEYS = (*NonFiniteGuard.KEYS, "critic/vf_loss", "critic/grad_norm")


# --- rewards -----------------------------------------------------------------------------
def score_futures(roles: dict[str, Any], batch: Batch) -> list:
    """Futures of everything that scores `batch`: reward functions and/or the reward model."""
    out = []
    if "reward" in roles:
        out.append(roles["reward"].compute_rewards(batch))
    if "reward_model" in roles:
        out.append(roles["reward_model"].compute_rm_scores(batch))
    return out


def combine_rewards(batch: Batch, rm_weight: float, overlong: tuple[int, int, float] | None) -> Batch:
    """rewards = sum_f w_f f (reward role) + rm_weight * reward/model, plus DAPO's overlong
    penalty when `overlong` = (max_new_tokens, buffer, factor). Failure counts of a missing
    reward role are 0."""
    total = batch[F.REWARDS] if F.REWARDS in batch else torch.zeros(len(batch))
    for k in ("reward_errors", "reward_timeouts"):
        if k not in batch:
            batch[k] = torch.zeros(len(batch), dtype=torch.long)
    if RM_SCORE in batch:
        total = total + rm_weight * batch[RM_SCORE]
    if overlong is not None:
        max_len, buffer, factor = overlong
        batch["reward/overlong"] = overlong_penalty(batch[F.RESPONSE_MASK].sum(-1), max_len, buffer, factor)  # [B]
        total = total + batch["reward/overlong"]
    batch[F.REWARDS] = total.float()
    return batch


def reward_args(cfg: PPOConfig) -> dict[str, Any]:
    a = cfg.algo
    return {"rm_weight": cfg.reward_model.weight if cfg.reward_model is not None else 0.0,
            "overlong": (cfg.rollout.max_new_tokens, a.overlong_buffer, a.overlong_penalty)
            if a.overlong_buffer else None}


def baseline_scores(cfg: PPOConfig, roles: dict[str, Any], batch: Batch) -> torch.Tensor:
    """ReMax: the reward of each prompt's greedy response, repeated on the prompt's n rows [B].
    (No overlong penalty on the baseline: its length is not tracked.)"""
    n = cfg.rollout.n
    firsts = batch.rows(torch.arange(0, len(batch), n))
    greedy = Batch(non_tensors=dict(firsts.non_tensors))
    greedy[F.COMPLETION_TEXT] = list(firsts[BASELINE_COMPLETION])
    for future in score_futures(roles, greedy):
        greedy = greedy.union(future.get())
    scores = combine_rewards(greedy, reward_args(cfg)["rm_weight"], None)[F.REWARDS]  # [U]
    return scores.repeat_interleave(n)  # [B]


# --- sampling ----------------------------------------------------------------------------
def sample(cfg: PPOConfig, roles: dict[str, Any], state: RunState, step: int) -> tuple[Batch, dict[str, float]]:
    """The step's rows, scored when dynamic sampling needs the scores to filter (else the
    scores are left to the concurrent scoring futures)."""
    rollout, P, n = roles["rollout"], cfg.data.prompts_per_step, cfg.rollout.n
    if not cfg.algo.dynamic_sampling:
        return rollout.generate(state.next_prompts(P), step, greedy_baseline=cfg.remax), {}
    kept: list[Batch] = []
    dropped: list[Batch] = []
    drawn = rounds = 0
    while True:
        # Extra rounds of a step get their own sampling seeds (the seed is a function of `step`).
        rows = rollout.generate(state.next_prompts(P), step + 1_000_000 * rounds, greedy_baseline=cfg.remax)
        for future in score_futures(roles, rows):
            rows = rows.union(future.get())
        rows = combine_rewards(rows, **reward_args(cfg))
        keep = dynamic_sampling_filter(rows[F.REWARDS], n)  # [P] groups with a signal
        drawn += len(keep)
        rows_keep = keep.repeat_interleave(n)  # [P*n]
        kept.append(rows.rows(rows_keep))
        dropped.append(rows.rows(~rows_keep))
        n_kept = sum(len(b) for b in kept) // n
        if n_kept >= P or rounds >= cfg.algo.dynamic_sampling_max_rounds:
            break
        rounds += 1
    filled = max(0, P - n_kept)
    batch = Batch.concat([b for b in kept + dropped if len(b)]).rows(torch.arange(P * n))
    return batch, {"dapo/extra_rounds": rounds, "dapo/groups_drawn": drawn,
                   "dapo/groups_kept": min(n_kept, P), "dapo/groups_filled": filled}


# --- checkpoints -------------------------------------------------------------------------
def critic_path(ckpt: Path) -> Path:
    return ckpt.parent / f"{CRITIC_PREFIX}{checkpoint_step(ckpt)}"


def save(roles: dict[str, Any], run: Any, cfg: PPOConfig, step: int, driver_state: dict[str, Any]) -> None:
    """The critic first (checkpoints/critic_step_N, atomic), then the actor's step_N (atomic,
    prunes to keep-K): a complete step_N always has its critic, and resume loads both."""
    ckpt = run.path / CHECKPOINTS_DIR / f"step_{step}"
    if "critic" in roles:
        roles["critic"].save_checkpoint(str(critic_path(ckpt)))
    save_checkpoint(roles["actor"], run, cfg.trainer, step, driver_state)
    live = {checkpoint_step(p) for p in list_checkpoints(run.path)}
    for p in (run.path / CHECKPOINTS_DIR).glob(f"{CRITIC_PREFIX}*"):  # the critics of pruned steps
        s = p.name[len(CRITIC_PREFIX):]
        if s.isdigit() and int(s) not in live:
            trash = unused_sibling(p, "del")  # renamed first: never a half-deleted critic_step_N
            os.replace(p, trash)
            shutil.rmtree(trash, ignore_errors=True)


def kl_controller(algo: Any) -> Any:
    """The KL-in-reward coefficient's controller (None when the KL is not in the reward)."""
    if not algo.kl_in_reward:
        return None
    if algo.kl_controller == "adaptive":
        return KL_CONTROLLERS["adaptive"](algo.kl_reward_coef, algo.kl_target, algo.kl_horizon)
    return KL_CONTROLLERS[algo.kl_controller](algo.kl_reward_coef)


# --- the loop ----------------------------------------------------------------------------
def train(cfg: PPOConfig) -> dict[str, float]:
    t, algo, n = cfg.trainer, cfg.algo, cfg.rollout.n
    torch.manual_seed(t.seed)
    run = open_run(cfg)  # locked; refuses a finished run's dir; config.yaml written
    roles: dict = {}
    try:
        state = RunState.fresh(cfg.data)
        roles = build_roles(cfg, probe_prompt=state.eval_rows[0]["prompt"])
        actor, rollout, ref, critic = roles["actor"], roles["rollout"], roles.get("reference"), roles.get("critic")
        warmup = cfg.critic.pretrain_steps if critic is not None else 0
        kl_ctl = kl_controller(algo)
        hyper = {k: v for k, v in {"gamma": algo.gamma, "lam": algo.lam, "whiten": algo.whiten_advantages}.items()
                 if estimator_reads(algo.advantage, k)}  # GAE / REINFORCE++ hyper-parameters
        timeline_path = run.path / timeline.TIMELINE_FILE
        if run.resume_from:
            saved = actor.load_checkpoint(str(run.resume_from))[0]
            state.restore(saved)
            if critic is not None:
                critic.load_checkpoint(str(critic_path(Path(run.resume_from))))
            if kl_ctl is not None:
                kl_ctl.load_state_dict(saved["kl_controller"])
            rollout.sync_weights(max(0, state.step - warmup))
            timeline.truncate_after(timeline_path, state.step)
        elif timeline_path.exists():
            timeline_path.unlink()
        timeline.take(roles)  # drop the records of set-up and resume calls
        log = metrics_logger(run, t, start_step=state.step)

        def evaluate_and_forget() -> dict[str, float]:  # the evaluation's calls are no step's overlap
            out = evaluate(rollout, state.eval_rows)
            timeline.take(roles)
            return out

        end = StepEnd(t, log, CriticAwareGuard(t.max_nonfinite_steps), evaluate_and_forget)
        try:
            if state.step == 0:
                state.first_eval = evaluate(rollout, state.eval_rows)
                log.log(0, state.first_eval)
                timeline.take(roles)
            while state.step < t.steps:
                step, timer, t0 = state.step + 1, Timer(), time.perf_counter()
                version = max(0, step - 1 - warmup)  # actor updates so far: the policy version
                with timer("rollout"):
                    batch, metrics = sample(cfg, roles, state, step)
                with timer("score"):  # every future in flight at once: concurrent on split pools
                    scored = F.REWARDS in batch
                    pending = [] if scored else score_futures(roles, batch)
                    if ref is not None:
                        pending.append(ref.compute_ref_logprobs(batch))
                    if critic is not None:
                        pending.append(critic.compute_values(batch))
                    if algo.recompute_old_logprobs:
                        pending.append(actor.compute_logprobs(batch))
                    else:  # the engine's logprobs equal the trainer's in fp32 (tested)
                        batch[F.OLD_LOGPROBS] = batch[F.ROLLOUT_LOGPROBS]
                    for future in pending:
                        batch = batch.union(future.get())
                    if not scored:
                        batch = combine_rewards(batch, **reward_args(cfg))
                    if cfg.remax:
                        batch["baseline_scores"] = baseline_scores(cfg, roles, batch)
                mask = batch[F.RESPONSE_MASK]  # [B, R]
                token_rewards = token_level_rewards(batch[F.REWARDS], mask)  # [B, R]
                if kl_ctl is not None:  # InstructGPT: r_t - beta KL_t(pi_old || ref)
                    token_rewards, kl = kl_in_reward(token_rewards, batch[F.OLD_LOGPROBS], batch[F.REF_LOGPROBS],
                                                     mask, beta=kl_ctl.value, estimator=algo.kl_reward_estimator)
                    metrics.update({"kl_reward/kl": kl.item(), "kl_reward/coef": kl_ctl.value,
                                    "kl_reward/paid": kl.item() * kl_ctl.value})
                    kl_ctl.update(kl.item(), n_steps=len(batch))
                batch[F.TOKEN_REWARDS] = token_rewards
                batch[F.ADVANTAGES], batch[F.RETURNS] = compute_advantages(
                    algo.advantage, scores=batch[F.REWARDS], response_mask=mask, token_rewards=token_rewards,
                    group_index=torch.arange(len(batch)) // n,
                    values=batch[F.VALUES] if critic is not None else None,
                    baseline_scores=batch["baseline_scores"] if cfg.remax else None, **hyper)
                if algo.recompute_old_logprobs:  # the engine (mu) against the trainer (pi_old)
                    weights, tis = truncated_is_weights(batch[F.OLD_LOGPROBS], batch[F.ROLLOUT_LOGPROBS], mask,
                                                        cap=algo.tis_cap or float("inf"))
                    metrics.update({k: v.item() for k, v in tis.items()})
                    if algo.tis_cap is not None:  # w * loss(A) = loss(w * A): see the docstring
                        batch[F.ADVANTAGES] = batch[F.ADVANTAGES] * weights
                if critic is not None:
                    metrics["critic/explained_var"] = explained_variance(batch[F.VALUES], batch[F.RETURNS], mask).item()
                    metrics["critic/returns_mean"] = masked_mean(batch[F.RETURNS], mask).item()
                with timer("update"):  # both launched, then both awaited: concurrent on split pools
                    actor_future = actor.submit("update", batch) if step > warmup else None
                    critic_future = critic.update_critic(batch) if critic is not None else None
                    update = actor_future.get() if actor_future is not None else [{}]
                    if critic_future is not None:  # per rank; the critic's metrics are global already
                        metrics.update(critic_future.get()[0])
                if actor_future is not None:
                    with timer("sync"):
                        parity = rollout.sync_weights(version + 1, check=t.check_weight_sync)
                    if t.check_weight_sync:
                        check_sync(parity, step)
                state.step = step
                metrics = {**metrics, **step_metrics(batch, update, version=version)}
                records = timeline.take(roles)
                timeline.append(timeline_path, step, records)
                metrics.update(timeline.step_overlaps(records))

                def save_step() -> None:
                    driver = state.to_dict()
                    if kl_ctl is not None:
                        driver["kl_controller"] = kl_ctl.state_dict()
                    save(roles, run, cfg, step, driver)
                    timeline.take(roles)

                end(step, metrics, timer, t0, save=save_step)
        finally:
            log.close()
    finally:
        close_run(run, roles, cfg.placement.backend)
    write_report(run.path)
    return {**{f"start/{k}": v for k, v in (state.first_eval or {}).items()}, **end.final_eval}
