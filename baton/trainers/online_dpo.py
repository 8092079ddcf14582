"""The online DPO driver: the policy's own samples, scored, sorted into preference pairs.

    baton online-dpo recipes/online_dpo_arithmetic.yaml [trainer.steps=20 ...]

One step, top to bottom, as the controller sees it:
    prompts --rollout.generate-->          rows (rollout.n per prompt, the policy's weights)
    rows    --reward.compute_rewards-->    scores (verifiers / reward functions)
    rows    --preference_pairs-->          pairs: best vs worst (or all) by score; ties and
                                           margins <= dpo.min_margin make none
    pairs   --reference.compute_ref_logprobs--> reference sequence logprobs
    pairs   --actor.update_dpo-->          new weights, rewards/*, logps/*, dpo/kl
    actor   --rollout.sync_weights-->      the engine samples with version step+1
    (every dpo.ref_refresh_every steps: the reference takes the actor's weights)

A step whose prompts all tie (every sample right, or every one wrong) makes no pair: it logs
`dpo/pairs: 0` and `dpo/skipped_update: 1` and takes no optimizer step (so the LR schedule
counts updates, not steps).

Departures from online DPO as published (Guo et al. 2024, "Direct Language Model Alignment
from Online AI Feedback"; TRL's OnlineDPOTrainer): N >= 2 samples per prompt, not exactly
two, so pairs are best vs worst (or every ordered pair with `dpo.pairing=all`), and prompts
without a valid pair are dropped instead of trained on as noisy pairs; scores come from
rule-based verifiers, not an AI judge; the reference may follow the policy every K steps.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from baton import fields as F
from baton.algos.pairs import PreferencePairs, preference_pairs
from baton.metrics import Timer, write_report
from baton.trainers.dpo_config import DPOConfig
from baton.trainers.dpo_roles import (build_dpo_roles, maybe_refresh_reference, reference_state,
                                      restore_reference, with_ref_logprobs)
from baton.trainers.grpo import step_metrics
from baton.trainers.run import (NonFiniteGuard, StepEnd, close_run, evaluate, metrics_logger, open_run,
                                save_checkpoint)
from baton.trainers.run_state import RunState
from baton.workers.dpo_actor import pair_rows


def pair_metrics(pairs: PreferencePairs, n_prompts: int) -> dict[str, Any]:
    """How many pairs a step made, how many prompts made none, and the pairs' score margin."""
    m: dict[str, Any] = {"dpo/pairs": len(pairs.chosen), "dpo/unpaired_prompts": pairs.n_unpaired,
                         "dpo/paired_prompt_frac": 1 - pairs.n_unpaired / n_prompts}
    if len(pairs.chosen):
        m["dpo/score_margin"] = pairs.margin.mean().item()
    return m


def train(cfg: DPOConfig) -> dict[str, float]:
    t, d = cfg.trainer, cfg.dpo
    torch.manual_seed(t.seed)
    run = open_run(cfg)  # locked; refuses a finished run's dir; config.yaml written
    roles: dict = {}
    try:
        state = RunState.fresh(cfg.data)
        roles = build_dpo_roles(cfg, temperature=cfg.rollout.temperature, task=cfg.data.task,
                                probe_prompt=state.eval_rows[0]["prompt"])
        actor, rollout, reward, ref = roles["actor"], roles["rollout"], roles["reward"], roles.get("reference")
        if run.resume_from:
            saved = actor.load_checkpoint(str(run.resume_from))[0]
            state.restore(saved)
            restore_reference(roles, saved)
            rollout.sync_weights(state.step)
        log = metrics_logger(run, t, start_step=state.step)
        end = StepEnd(t, log, NonFiniteGuard(t.max_nonfinite_steps), lambda: evaluate(rollout, state.eval_rows))
        try:
            if state.step == 0:
                state.first_eval = evaluate(rollout, state.eval_rows)
                log.log(0, state.first_eval)
            while state.step < t.steps:
                step, timer, t0 = state.step + 1, Timer(), time.perf_counter()
                prompts = state.next_prompts(cfg.data.prompts_per_step)
                with timer("rollout"):
                    rows = rollout.generate(prompts, step)
                with timer("score"):
                    rows = rows.union(reward.compute_rewards(rows).get())
                pairs = preference_pairs(rows[F.REWARDS], cfg.rollout.n, d.pairing, d.min_margin)
                update: list[dict[str, float]] = [{"dpo/skipped_update": 1}]  # no pair: no step
                if len(pairs.chosen):
                    batch = pair_rows(rows, pairs.chosen, pairs.rejected, multiple=cfg.placement.world_size)
                    with timer("reference"):
                        batch = with_ref_logprobs(ref, batch)
                    with timer("update"):  # skips optimizer steps whose loss/grad is not finite
                        update = [{**actor.update_dpo(batch)[0], "dpo/skipped_update": 0}]
                with timer("sync"):
                    rollout.sync_weights(step)
                refreshed = maybe_refresh_reference(roles, d.ref_refresh_every, step)
                state.step = step
                metrics = {**step_metrics(rows, update, version=step - 1),
                           **pair_metrics(pairs, len(prompts)), "dpo/ref_refreshed": int(refreshed)}
                end(step, metrics, timer, t0, save=lambda: save_checkpoint(
                    actor, run, t, step, {**state.to_dict(), **reference_state(roles, d.ref_refresh_every, step)}))
        finally:
            log.close()
    finally:
        close_run(run, roles, cfg.placement.backend)
    write_report(run.path)
    return {**{f"start/{k}": v for k, v in (state.first_eval or {}).items()}, **end.final_eval}
