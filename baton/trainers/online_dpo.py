"""The online DPO driver: the policy's own samples, scored, sorted into preference pairs.

    baton train recipes/online_dpo_arithmetic.yaml [trainer.steps=20 ...]

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

from typing import Any

import torch

from baton import fields as F
from baton.algos.pairs import PreferencePairs, preference_pairs
from baton.trainers.dpo_config import DPOConfig
from baton.trainers.dpo_roles import (build_dpo_roles, maybe_refresh_reference, reference_state,
                                      restore_reference, with_ref_logprobs)
from baton.trainers.report.samples import SampleLog
from baton.trainers.session.run import RunSession, save_checkpoint
from baton.trainers.session.state import RunState
from baton.sources import evaluation, row_source
from baton.trainers.report.step_metrics import check_sync, step_metrics, sync_tolerance
from baton.workers.dpo_actor import pair_rows


def pair_metrics(pairs: PreferencePairs, n_prompts: int) -> dict[str, Any]:
    """How many pairs a step made, how many prompts made none, and the pairs' score margin."""
    m: dict[str, Any] = {"dpo/pairs": len(pairs.chosen), "dpo/unpaired_prompts": pairs.n_unpaired,
                         "dpo/paired_prompt_frac": 1 - pairs.n_unpaired / n_prompts}
    if len(pairs.chosen):
        m["dpo/score_margin"] = pairs.margin.mean().item()
    return m


def train(cfg: DPOConfig) -> dict[str, float]:
    d = cfg.dpo
    with RunSession(cfg) as run:
        state = RunState.fresh(cfg.data)
        run.roles = roles = build_dpo_roles(cfg, temperature=cfg.rollout.temperature, task=cfg.data.task,
                                            probe_prompt=state.eval_rows[0]["prompt"])
        actor, reward, ref = roles["actor"], roles["reward"], roles.get("reference")
        source = row_source(cfg, roles, state)
        run.closing.append(source)
        samples = SampleLog(cfg.trainer.run_dir, cfg.trainer.eval_every, cfg.trainer.steps)

        def restore(path: str) -> None:
            saved = actor.load_checkpoint(path)[0]
            state.restore(saved)
            restore_reference(roles, saved)
            source.weights_updated(state.step)

        run.start(state, restore=restore, evaluate=lambda: evaluation(cfg, roles, state.eval_rows))
        for step, timed in run.steps():
            with timed("rollout"):
                rows = source.rows(step)
            with timed("score"):
                rows = rows.union(reward.compute_rewards(rows).get())
            samples.write(step, rows, torch.arange(len(rows)) // cfg.rollout.n)  # samples.jsonl: a few, scored
            pairs = preference_pairs(rows[F.REWARDS], cfg.rollout.n, d.pairing, d.min_margin)
            update: list[dict[str, float]] = [{"dpo/skipped_update": 1}]  # no pair: no step
            if len(pairs.chosen):
                batch = pair_rows(rows, pairs.chosen, pairs.rejected, multiple=cfg.placement.world_size)
                with timed("reference"):
                    batch = with_ref_logprobs(ref, batch)
                with timed("update"):  # skips optimizer steps whose loss/grad is not finite
                    update = [{**actor.update_dpo(batch)[0], "dpo/skipped_update": 0}]
            with timed("sync"):
                parity = source.weights_updated(step, check=run.t.check_weight_sync)
            if run.t.check_weight_sync:
                check_sync(parity, step, sync_tolerance(cfg))
            refreshed = maybe_refresh_reference(roles, d.ref_refresh_every, step)
            metrics = {**step_metrics(rows, update, version=step - 1),
                       **pair_metrics(pairs, cfg.data.prompts_per_step), "dpo/ref_refreshed": int(refreshed)}
            run.end_step(step, metrics, save=lambda: save_checkpoint(
                actor, run.run, run.t, step, {**state.to_dict(), **reference_state(roles, d.ref_refresh_every, step)}))
    return run.result()
