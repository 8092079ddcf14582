"""The PPO-family driver: GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++, ReMax, GSPO, PPO with a
critic and GAE, and on-policy distillation (a teacher role, `algo.advantage: distill`) — one
step, roles and options switched on by config (`baton.trainers.ppo_config`).

    baton train recipes/grpo_arithmetic.yaml [trainer.steps=N ...]     algorithm: grpo
    baton train recipes/ppo_arithmetic.yaml [placement.backend=ray ...] algorithm: ppo
    baton train recipes/distill_arithmetic.yaml                         a teacher: section

One step, top to bottom, as the controller sees it:
    source  --rows(step)-->                          rows (n per prompt, behaviour logprobs, version):
                                                     this run's rollout, a generator running ahead
                                                     (trainer.mode), or the trajectory API
            (DAPO dynamic sampling: score, drop groups with equal rewards, draw more prompts
             until the batch is full, at most algo.dynamic_sampling_max_rounds more)
    rows    --reward.compute_rewards-->              rewards          } futures, all in flight
    rows    --reward_model.compute_rm_scores-->      reward/model     } at once: concurrent
    rows    --reference.compute_ref_logprobs-->      ref logprobs     } when the roles sit on
    rows    --critic.compute_values-->               values           } different pools
    rows    --teacher.compute_teacher_logprobs-->    teacher logprobs } (distill)
    rows    --actor.compute_logprobs-->              proximal logprobs (recompute_old_logprobs or
                                                     an algo.off_policy that needs them)
            (each line: a role's declared `score` call, `baton.trainers.role_specs.ROLES`, in
             registration order; a role whose columns the rows carry already is not called)
    scores  --token_level_rewards (- beta KL_t, algo.kl_in_reward)--> token rewards
    tokens  --ADVANTAGES[algo.advantage]-->          advantages, returns (GAE: returns = A + V
                                                     before whitening; distill: A_t = log
                                                     teacher - log student, discount 0)
    rows    --OFF_POLICY[algo.off_policy]-->         advantages x w(pi_prox / mu)
    rows    --actor.update  ||  critic.update_critic-->   all launched, then all awaited;
                                                     the update's first forward also gives
                                                     rollout/logprob_mismatch_kl (engine vs trainer)
    source  --weights_updated(step)-->               the generator(s) sample with the new weights

Departures: an off-policy correction multiplies the advantages by w_t instead of the
per-token loss: every policy loss here (ppo_clip with or without dual clip, vanilla, gspo)
is positively homogeneous in the advantage (loss(wA) = w loss(A) for w >= 0), so this is the
same loss and gradient, and it leaves the KL and entropy terms unweighted as verl does. The
critic trains alone for `critic.pretrain_steps` steps (the actor keeps its weights, so those
steps' rows come from the initial policy). DAPO's dynamic sampling fills a batch it could
not fill within the cap with dropped (zero-signal) groups, so every step has the configured
size. One optimizer step per `actor.mini_batch_size` rows (the paper's "mu" iterations are
`actor.epochs`); the KL term is optional (off by default, as in DAPO / Dr. GRPO); clip-higher
(DAPO) is on by default (clip_high=0.28). Weights version = trainer step: after step s the
weights are version s (pretrain steps included), so policy age = s - 1 - the row's version.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Collection

import torch

from baton import fields as F
from baton.algos import (ADVANTAGE_INPUTS, compute_advantages, dynamic_sampling_filter,
                         estimator_needs, kl_in_reward, overlong_penalty, token_level_rewards)
from baton.algos.kl_control import build_kl_controller
from baton.algos.off_policy import mismatch_kl
from baton.batch import Batch
from baton.runs.checkpoints import CHECKPOINTS_DIR, checkpoint_step, list_checkpoints
from baton.runs.fsutil import unused_sibling
from baton.sources import evaluation, row_source, source_spec
from baton.trainers.placement.generator import check_placed
from baton.trainers.placement.roles import build_roles
from baton.trainers.ppo_config import PPOConfig
from baton.trainers.role_specs import REWARD_COUNTS, role_specs
from baton.trainers.session.ledger import step_entry
from baton.trainers.session.run import NonFiniteGuard, RunSession, save_checkpoint
from baton.trainers.session.state import RunState
from baton.trainers.report.step_metrics import check_sync, step_metrics, sync_tolerance
from baton.trainers.report.queue_health import QueueHealth, matmul_rate
from baton.trainers.report.signal_watch import StepSignal
from baton.trainers.session.timeline import TIMELINE_FILE, Timeline
from baton.workers.rollout import BASELINE_COMPLETION

MISMATCH_ROWS = 64  # rows scored for rollout/logprob_mismatch_kl in a step without an actor update


class CriticAwareGuard(NonFiniteGuard):
    """The run's non-finite guard, also counting steps whose critic loss / gradient was not
    finite (the critic skipped those optimizer steps, as the actor does)."""

    KEYS = (*NonFiniteGuard.KEYS, "critic/vf_loss", "critic/grad_norm")


def queue_health(cfg: PPOConfig) -> QueueHealth:
    """The run's queue metrics, against the matmul rate of the update's processes (one
    thread's fp32 rate x threads x ranks on the CPU; a GPU's bf16 rate x ranks)."""
    from baton.trainers.placement.auto import count_model_params

    p = cfg.placement
    ranks = max(1, p.world_size)
    if p.gpus_per_worker and torch.cuda.is_available():
        rate = matmul_rate("cuda") * ranks
    else:
        rate = matmul_rate("cpu", threads=1) * ranks * max(1, p.threads_per_worker)
    return QueueHealth(count_model_params(cfg.model.path), rate, epochs=cfg.actor.epochs)


def sampled_mismatch_kl(actor: Any, batch: Batch) -> float:
    """rollout/logprob_mismatch_kl of a step whose actor does not update (whose update's first
    forward would otherwise give it): the trainer's logprobs of MISMATCH_ROWS rows."""
    rows = batch.rows(torch.arange(min(len(batch), MISMATCH_ROWS)))
    trainer = actor.compute_logprobs(rows).get()[F.OLD_LOGPROBS]  # rows may hold old_logprobs already
    return mismatch_kl(trainer, rows[F.ROLLOUT_LOGPROBS], rows[F.RESPONSE_MASK]).item()


# --- rewards ---------------------------------------------------------------------------
def score_futures(cfg: PPOConfig, roles: dict[str, Any], batch: Batch, rewards_only: bool = False) -> list:
    """Futures of the declared roles' `score` calls on `batch` (`baton.trainers.role_specs`),
    in registration order: those the step runs (`score_if`) whose columns `batch` does not
    carry yet (a generator that ran the reward role, DAPO's sampling, scored them);
    `rewards_only`: the roles that score the reward (DAPO's sampling, ReMax's baseline)."""
    return [getattr(roles[name], spec.score)(batch) for name, spec in role_specs(roles)
            if spec.score and spec.score_if(cfg) and (spec.rewards or not rewards_only)
            and not all(column in batch for column in spec.columns)]


def total_reward(cfg: PPOConfig, roles: Collection[str], batch: Batch, overlong: bool = True) -> dict[str, torch.Tensor]:
    """{rewards: sum_f w_f f (the reward role, or the source when its rows arrive scored:
    `cfg.scored`) + every role's declared `reward_term` (reward_model.weight * reward/model)
    (+ DAPO's overlong penalty), reward/overlong, failure counts (0 without a reward role)};
    `roles`: the run's roles, which scored `batch`."""
    a, B = cfg.algo, len(batch)
    rewarded = "reward" in roles
    out = {k: batch[k] if rewarded else torch.zeros(B, dtype=torch.long) for k in REWARD_COUNTS}
    total = batch[F.REWARDS].float() if cfg.scored else torch.zeros(B)
    for _, spec in role_specs(roles):
        if spec.reward_term is not None:
            total = total + spec.reward_term(cfg, batch)
    if overlong and a.overlong_buffer:
        out["reward/overlong"] = overlong_penalty(batch[F.RESPONSE_MASK].sum(-1), cfg.rollout.max_new_tokens,
                                                  a.overlong_buffer, a.overlong_penalty)  # [B]
        total = total + out["reward/overlong"]
    return {**out, F.REWARDS: total.float()}


def score(cfg: PPOConfig, roles: dict[str, Any], batch: Batch) -> Batch:
    """`batch` with the columns of the roles that score the reward."""
    for future in score_futures(cfg, roles, batch, rewards_only=True):
        batch = batch.union(future.get())
    return batch


def baseline_scores(cfg: PPOConfig, roles: dict[str, Any], batch: Batch) -> torch.Tensor:
    """ReMax: the reward of each prompt's greedy response, repeated on the prompt's n rows [B].
    (No overlong penalty on the baseline: its length is not tracked.)"""
    n = cfg.rollout.n
    firsts = batch.rows(torch.arange(0, len(batch), n))
    greedy = Batch(non_tensors=dict(firsts.non_tensors))
    greedy[F.COMPLETION_TEXT] = list(firsts[BASELINE_COMPLETION])
    return total_reward(cfg, roles, score(cfg, roles, greedy), overlong=False)[F.REWARDS].repeat_interleave(n)  # [B]


# --- sampling ----------------------------------------------------------------------------
def sample(cfg: PPOConfig, roles: dict[str, Any], source: Any, step: int) -> tuple[Batch, dict[str, float]]:
    """The step's rows; with DAPO's dynamic sampling, scored here (`train` then scores them
    no more) to drop the groups whose rewards all tie and draw more prompts (the colocated
    `RolloutSource` only)."""
    P, n = cfg.data.prompts_per_step, cfg.rollout.n
    if not cfg.algo.dynamic_sampling:
        return source.rows(step), {}
    kept: list[Batch] = []
    dropped: list[Batch] = []
    drawn = rounds = 0
    while True:
        rows = score(cfg, roles, source.rows(step, draw=rounds))
        keep = dynamic_sampling_filter(total_reward(cfg, roles, rows)[F.REWARDS], n)  # [P] groups with a signal
        drawn += len(keep)
        rows_keep = keep.repeat_interleave(n)  # [P*n]
        kept.append(rows.rows(rows_keep))
        dropped.append(rows.rows(~rows_keep))
        n_kept = sum(len(b) for b in kept) // n
        if n_kept >= P or rounds >= cfg.algo.dynamic_sampling_max_rounds:
            break
        rounds += 1
    batch = Batch.concat([b for b in kept + dropped if len(b)]).rows(torch.arange(P * n))
    return batch, {"dapo/extra_rounds": rounds, "dapo/groups_drawn": drawn,
                   "dapo/groups_kept": min(n_kept, P), "dapo/groups_filled": max(0, P - n_kept)}


# --- checkpoints -------------------------------------------------------------------------
def role_checkpoints(roles: dict[str, Any], ckpt: Path) -> list[tuple[Any, Path]]:
    """(worker group, its checkpoint beside the actor's `ckpt`) of the roles that declare one
    (the critic: checkpoints/critic_step_N)."""
    return [(roles[name], ckpt.parent / f"{spec.checkpoint}{checkpoint_step(ckpt)}")
            for name, spec in role_specs(roles) if spec.checkpoint]


def save(roles: dict[str, Any], run: RunSession, step: int, driver_state: dict[str, Any]) -> None:
    """The roles' own checkpoints first (checkpoints/critic_step_N, atomic), then the actor's
    step_N (atomic, prunes to keep-K): a complete step_N always has its critic, and resume
    loads both."""
    ckpt = run.path / CHECKPOINTS_DIR / f"step_{step}"
    for group, path in role_checkpoints(roles, ckpt):
        group.save_checkpoint(str(path))
    save_checkpoint(roles["actor"], run.run, run.t, step, driver_state)
    live = {checkpoint_step(p) for p in list_checkpoints(run.path)}
    for _, spec in role_specs(roles):
        if spec.checkpoint:
            prune(run.path / CHECKPOINTS_DIR, spec.checkpoint, live)


def prune(ckpt_dir: Path, prefix: str, live: set[int]) -> None:
    """Delete a role's checkpoints `prefix`N of steps N the actor pruned (not in `live`)."""
    for p in ckpt_dir.glob(f"{prefix}*"):
        s = p.name[len(prefix):]
        if s.isdigit() and int(s) not in live:
            trash = unused_sibling(p, "del")  # renamed first: never a half-deleted critic_step_N
            os.replace(p, trash)
            shutil.rmtree(trash, ignore_errors=True)


def kl_controller(algo: Any) -> Any:
    """The KL-in-reward coefficient's controller, given the keys it declares (None when the
    KL is not in the reward)."""
    return build_kl_controller(algo) if algo.kl_in_reward else None


# --- the loop ----------------------------------------------------------------------------
def train(cfg: PPOConfig) -> dict[str, float]:
    check_placed(cfg)  # load_config placed it (baton.config.LOAD_STEPS); a config built by hand is refused
    t, algo = cfg.trainer, cfg.algo
    with RunSession(cfg) as run:
        state = RunState.fresh(cfg.data)
        run.roles = roles = build_roles(cfg, probe_prompt=state.eval_rows[0]["prompt"])
        actor, declared = roles["actor"], role_specs(roles)  # the declared roles this run built
        source = row_source(cfg, roles, state)
        run.closing.append(source)
        updating = [(roles[name], spec.update) for name, spec in declared if spec.update]  # beside the actor's
        if updating or len({cfg.placement.pool_of(r) for r in roles}) > 1 and t.mode == "sync":
            run.timeline = Timeline(roles, run.path / TIMELINE_FILE)  # which role ran when (split pools)
        kl_ctl = kl_controller(algo)
        watch = StepSignal(cfg)  # reward/tied_group_frac (a warning when most groups tie), samples.jsonl
        health = queue_health(cfg)  # queue/*: rows/s, idle shares, the rows' ages, the update's matmul share
        after = [spec.after for _, spec in declared if spec.after is not None and spec.score_if(cfg)]
        hyper = estimator_needs(algo.advantage).hyper_args(algo)  # by name, as the estimator declares

        def restore(path: str) -> None:
            saved = actor.load_checkpoint(path)[0]
            state.restore(saved)
            for group, role_path in role_checkpoints(roles, Path(path)):
                group.load_checkpoint(str(role_path))
            if kl_ctl is not None:
                kl_ctl.load_state_dict(saved["kl_controller"])
            source.load_state_dict(state.source)
            source.weights_updated(state.step)

        def checkpoint(step: int) -> None:  # the source's staleness state (rows sampled ahead) too
            state.source = source.state_dict()
            driver = {**state.to_dict(), **({"kl_controller": kl_ctl.state_dict()} if kl_ctl else {})}
            save(roles, run, step, driver)
            source.checkpointed(step)  # written: what it trained may be acknowledged (the API's groups)

        run.start(state, restore=restore, guard=CriticAwareGuard(t.max_nonfinite_steps),
                  evaluate=lambda: evaluation(cfg, roles, state.eval_rows))  # as the source generates
        for step, timed in run.steps():
            with timed("rollout"):
                batch, metrics = sample(cfg, roles, source, step)
                state.ledger.append(step_entry(step, batch, t.seed))  # saved with the step's checkpoint
                metrics.update(source.metrics())  # the source's own (agent/*)
            with timed("score"):  # every declared role's future in flight at once: concurrent on split pools
                for future in score_futures(cfg, roles, batch):
                    batch = batch.union(future.get())
                if F.OLD_LOGPROBS not in batch:  # no proximal logprobs: PPO's ratio against the behaviour
                    batch[F.OLD_LOGPROBS] = batch[F.ROLLOUT_LOGPROBS]  # logprobs (= the trainer's in fp32)
                for key, value in total_reward(cfg, roles, batch).items():
                    batch[key] = value
                if cfg.remax:
                    batch[F.BASELINE_SCORES] = baseline_scores(cfg, roles, batch)
            mask = batch[F.RESPONSE_MASK]  # [B, R]
            # the source's per-token rewards (agents' turns) where it placed them, else the reward
            # on the last token (baton.rows)
            token_rewards = torch.where(batch[F.HAS_TOKEN_REWARDS][:, None], batch[F.TOKEN_REWARDS],
                                        token_level_rewards(batch[F.REWARDS], mask))  # [B, R]
            if kl_ctl is not None:  # InstructGPT: r_t - beta KL_t(pi_old || ref)
                token_rewards, kl = kl_in_reward(token_rewards, batch[F.OLD_LOGPROBS], batch[F.REF_LOGPROBS],
                                                 mask, beta=kl_ctl.value, estimator=algo.kl_reward_estimator)
                metrics.update({"kl_reward/kl": kl.item(), "kl_reward/coef": kl_ctl.value,
                                "kl_reward/paid": kl.item() * kl_ctl.value})
                kl_ctl.update(kl.item(), n_steps=len(batch))
            batch[F.TOKEN_REWARDS] = token_rewards
            groups = batch[F.GROUP_INDEX]  # [B] every source numbers its groups (baton.rows)
            # the estimator's declared inputs, by column (the scalar reward is its `scores`)
            batch[F.ADVANTAGES], batch[F.RETURNS] = compute_advantages(
                algo.advantage, **{k: batch[k] for k in ADVANTAGE_INPUTS if k in batch}, scores=batch[F.REWARDS],
                **hyper)
            for hook in after:  # the declared roles' metrics (the off-policy correction weighs the advantages)
                metrics.update(hook(cfg, batch))
            with timed("update"):  # all launched, then all awaited: concurrent on split pools
                actor_update = actor.submit("update", batch) if step > cfg.pretrain_steps else None
                launched = [getattr(group, method)(batch) for group, method in updating]
                update = actor_update.get() if actor_update is not None else [{}]
                for future in launched:  # per rank; the critic's metrics are global already
                    metrics.update(future.get()[0])
            if actor_update is None:  # critic pretraining: no update forward measured the engine
                metrics["rollout/logprob_mismatch_kl"] = sampled_mismatch_kl(actor, batch)
            with timed("sync"):
                parity = source.weights_updated(step, check=t.check_weight_sync)
            if source_spec(cfg).checks_sync:  # the colocated engine, the API's servers (other
                with timed("verify"):  # sources: their receivers check before installing)
                    metrics.update(source.sync_metrics())
            if t.check_weight_sync:
                check_sync(parity, step, sync_tolerance(cfg))
            metrics.update(watch.check(step, batch, groups))
            metrics.update(health.step(batch, timed.times, version=step - 1))
            run.end_step(step, {**metrics, **step_metrics(batch, update, version=step - 1)},
                         save=lambda: checkpoint(step))
    return run.result()
