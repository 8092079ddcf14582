#!/usr/bin/env python3
"""Mutation score of the learning path: a fixed, reviewed list of semantic mutants (sign
flips, dropped terms, swapped clip bounds, a removed detach, mean for sum, off-by-one masks,
a weight applied twice, staleness ignored), each applied alone to a scratch copy of the
working tree, each run against the default-run tests that should kill it.

    .venv/bin/python scripts/mutants.py                 # every mutant; the table and the score (.ci/run)
    .venv/bin/python scripts/mutants.py --smoke         # SMOKE: 5 of them, a quick check
    .venv/bin/python scripts/mutants.py --only ppo-gae-negated ppo-offpolicy-dropped
    .venv/bin/python scripts/mutants.py --list          # the list, nothing run
    .venv/bin/python scripts/mutants.py --check         # every original snippet is in its file once

How: the tracked and untracked-not-ignored files are copied to a temp dir once (never the
working tree: it is only read); each mutant replaces its `original` snippet (which must
occur exactly once in its file) by `replacement`, runs
`python -m pytest -x -q -n 0 -p no:cacheprovider TESTS` there (PYTHONPATH = the copy, so
`import baton` is the mutated code; PYTHONDONTWRITEBYTECODE: no stale bytecode between
mutants), and restores the file. A mutant is killed when pytest fails (exit != 0, a timeout
included; exit 5, no test ran, is reported as NO TESTS and counts as surviving); first the
unmutated copy must pass every selection, or the script stops.

Which tests: each mutant names its own, from the default run (nothing `slow`): the unit
tests of its module under tests/algos/ (T_* below), the direction tests of tests/direction/
that cover its path (DIRECTION_* below: one real step of the family, observed at the
workers' update), and for a few a worker or trainer test file; `--list` prints them. Each
takes ~2-50 s on 2 loaded cores (pytest stops at the first failure).

Adding a mutant (e.g. for a new algorithm): append a `Mutant(...)` to MUTANTS with the tests
that should kill it (a selection below, or a test file / node id); `--check` (run by
tests/test_mutants.py in the default run) keeps every snippet present as the code moves.
Exit status: 0 when every mutant is killed, 1 when any survives (or the baseline fails).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# --- test selections (default-run tests; each a few seconds to ~30 s on a loaded 2-core box) ---
D = "tests/direction/test_ppo_family.py::"
DIRECTION_GRPO = (D + "test_group_estimators",)
DIRECTION_GAE = (D + "test_ppo_gae_advantages_are_returns_minus_values_and_the_critic_fits_them",)
DIRECTION_OFF_POLICY = (D + "test_off_policy_weights_scale_the_update_exactly_where_they_are_not_one",)
DIRECTION_KL_REWARD = (D + "test_kl_in_the_reward_is_subtracted_per_token",)
DIRECTION_KL_LOSS = (D + "test_kl_in_the_loss_pulls_toward_the_reference",)
DIRECTION_GSPO = (D + "test_gspo_pushes_rewarded_rows_up",)
DIRECTION_DAPO = (D + "test_dapo_keeps_groups_with_a_signal_and_pushes_them",)
DIRECTION_RPP = (D + "test_reinforce_pp_whitens_over_the_batch",)
DIRECTION_REMAX = (D + "test_remax_subtracts_the_greedy_reward",)
DIRECTION_DPO = ("tests/direction/test_preference.py",)
DIRECTION_SFT = ("tests/direction/test_supervised.py",)
DIRECTION_MASK = ("tests/direction/test_observation_mask.py",)
DIRECTION_CLIP = ("tests/direction/test_clip.py",)


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to the repository root
    original: str  # occurs exactly once in the file
    replacement: str
    description: str
    tests: tuple[str, ...]  # pytest paths / node ids that should kill it


def M(id: str, file: str, original: str, replacement: str, description: str, *tests: str) -> Mutant:
    return Mutant(id, file, original, replacement, description, tuple(tests))


PPO = "baton/trainers/ppo.py"
ROLE_SPECS = "baton/trainers/role_specs.py"  # the roles' declared step hooks (the off-policy correction, the RM's term)
ADV = "baton/algos/advantages.py"
PL = "baton/algos/policy_loss.py"
T_ADV, T_PL, T_OBJ, T_AGG = ("tests/algos/test_advantages.py",), ("tests/algos/test_policy_loss.py",), \
    ("tests/algos/test_objective.py",), ("tests/algos/test_aggregate.py",)
T_KL, T_TOK, T_OFF, T_VAL = ("tests/algos/test_kl.py",), ("tests/algos/test_token_rewards.py",), \
    ("tests/algos/test_off_policy.py",), ("tests/algos/test_value.py",)
T_DPO, T_PAIRS, T_DAPO, T_RPO = ("tests/algos/test_dpo.py",), ("tests/algos/test_pairs.py",), \
    ("tests/algos/test_dapo.py",), ("tests/algos/test_rpo.py",)
T_MASKED, T_KLCTL = ("tests/algos/test_masked.py",), ("tests/algos/test_kl.py", "tests/algos/test_token_rewards.py")

MUTANTS: list[Mutant] = [
    # --- advantage estimators (baton/algos/advantages.py) ---------------------------------
    M("grpo-sign", ADV, "    adv = scores - mean  # [B]", "    adv = mean - scores  # [B]",
      "GRPO: baseline minus reward", *T_ADV, *DIRECTION_GRPO),
    M("grpo-no-std", ADV, "        adv = adv / (std + eps)  # [B]", "        adv = adv  # [B]",
      "GRPO: the std division dropped (Dr. GRPO everywhere)", *T_ADV, *DIRECTION_GRPO),
    M("drgrpo-std", ADV, "group_size=group_size, norm_by_std=False)", "group_size=group_size, norm_by_std=True)",
      "Dr. GRPO divides by the std again", *T_ADV, *DIRECTION_GRPO),
    M("rloo-mean-baseline", ADV, "count / (count - 1).clamp(min=1)", "count / count.clamp(min=1)",
      "RLOO: the group mean (self included) instead of leave-one-out", *T_ADV, *DIRECTION_GRPO),
    M("remax-sign", ADV, "    diff = scores - baseline_scores  # [B]", "    diff = baseline_scores - scores  # [B]",
      "ReMax: greedy baseline minus reward", *T_ADV, *DIRECTION_REMAX),
    M("returns-no-gamma", ADV, "token_rewards[:, t] + gamma * running", "token_rewards[:, t] + running",
      "REINFORCE++ returns: gamma dropped", *T_ADV, *DIRECTION_RPP),
    M("rpp-not-whitened", ADV, "    return masked_whiten(returns, response_mask, eps=eps), returns",
      "    return returns, returns", "REINFORCE++: the returns not whitened over the batch", *T_ADV, *DIRECTION_RPP),
    M("gae-delta-sign", ADV, "delta = token_rewards[:, t] + gamma * next_value - values[:, t]",
      "delta = token_rewards[:, t] + gamma * next_value + values[:, t]", "GAE: + V_t in the TD error",
      *T_ADV, *DIRECTION_GAE),
    M("gae-no-lambda", ADV, "gae = delta + gamma * lam * next_adv", "gae = delta + gamma * next_adv",
      "GAE: lambda dropped", *T_ADV, *DIRECTION_GAE),
    M("gae-returns-no-value", ADV, "returns = torch.where(mask, adv + values, 0.0)",
      "returns = torch.where(mask, adv, 0.0)", "GAE: the critic's targets without V (returns = A)",
      *T_ADV, *DIRECTION_GAE),
    M("gae-no-detach", ADV, "token_rewards, values = token_rewards.detach(), values.detach()",
      "token_rewards, values = token_rewards, values",
      "GAE: values not detached (gradient into the critic's targets)", *T_ADV, *DIRECTION_GAE),
    M("advantage-on-padding", ADV, "return per_row.unsqueeze(-1) * response_mask.to(per_row.dtype)",
      "return per_row.unsqueeze(-1) * torch.ones_like(response_mask, dtype=per_row.dtype)",
      "sequence advantages broadcast onto padding too", *T_ADV, *DIRECTION_GRPO),
    # --- policy losses (baton/algos/policy_loss.py) -----------------------------------------
    M("clip-bounds-swapped", PL, "ratio.clamp(1 - clip_low, 1 + clip_high)",
      "ratio.clamp(1 - clip_high, 1 + clip_low)", "PPO clip: clip_low and clip_high swapped", *T_PL,
      *DIRECTION_CLIP),
    M("clip-min-for-max", PL, "    loss = torch.maximum(unclipped, clipped)  # [B, R] pessimistic bound",
      "    loss = torch.minimum(unclipped, clipped)  # [B, R] pessimistic bound",
      "PPO clip: the optimistic bound", *T_PL),
    M("ppo-unclipped-sign", PL, "    unclipped = -advantages * ratio  # [B, R]",
      "    unclipped = advantages * ratio  # [B, R]", "PPO clip: the unclipped term's sign", *T_PL,
      *DIRECTION_GRPO),
    M("dual-clip-side", PL, "capped = (advantages < 0) & (loss > cap)", "capped = (advantages > 0) & (loss > cap)",
      "dual clip caps positive advantages instead of negative", *T_PL),
    M("gspo-token-ratio", PL, "log_s = logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)",
      "log_s = log_ratio", "GSPO: the token ratio instead of the sequence ratio", *T_PL, *DIRECTION_GSPO),
    M("gspo-sign", PL, "    unclipped = -advantages * s  # [B, R]", "    unclipped = advantages * s  # [B, R]",
      "GSPO: the unclipped term's sign", *T_PL, *DIRECTION_GSPO),
    # --- the actor's objective, aggregation, KL (objective.py, aggregate.py, kl.py) ---------
    M("kl-loss-sign", "baton/algos/objective.py", "per_token = per_token + kl_coef * kl",
      "per_token = per_token - kl_coef * kl", "KL in the loss pushes away from the reference", *T_OBJ,
      *DIRECTION_KL_LOSS),
    M("entropy-sign", "baton/algos/objective.py", "per_token = per_token - entropy_coef * entropy",
      "per_token = per_token + entropy_coef * entropy", "the entropy bonus minimises entropy", *T_OBJ),
    M("rows-token-rewards-overwrite", "baton/rows.py", "tok_r[b, int(p)] += float(r)", "tok_r[b, int(p)] = float(r)",
      "to_batch: two per-token rewards at one position overwrite instead of adding", "tests/test_rows.py"),
    M("token-mean-is-sum", "baton/algos/aggregate.py", "    return masked_sum(loss, mask) / global_tokens",
      "    return masked_sum(loss, mask)", "token-mean: sum for mean", *T_AGG),
    M("seq-mean-no-length", "baton/algos/aggregate.py",
      "per_seq = masked_sum(loss, mask, dim=-1) / lengths  # [B]", "per_seq = masked_sum(loss, mask, dim=-1)  # [B]",
      "seq-mean-token-mean: the per-sequence token mean becomes a sum", *T_AGG),
    M("drgrpo-no-max-len", "baton/algos/aggregate.py", "return masked_sum(loss, mask) / max_len / global_seqs",
      "return masked_sum(loss, mask) / global_seqs", "seq-mean-token-sum-norm: the max_len constant dropped",
      *T_AGG),
    M("k3-sign", "baton/algos/kl.py", "    return torch.exp(neg_d) - neg_d - 1  # [B, R]",
      "    return torch.exp(neg_d) + neg_d - 1  # [B, R]", "k3: the log term's sign", *T_KL, *DIRECTION_KL_LOSS),
    M("k1-reversed", "baton/algos/kl.py", "    return logprobs - ref_logprobs  # [B, R]",
      "    return ref_logprobs - logprobs  # [B, R]", "k1: log ref - log pi", *T_KL, *DIRECTION_KL_REWARD),
    # --- rewards on tokens, KL in the reward, its controller ----------------------------------
    M("kl-reward-sign", "baton/algos/token_rewards.py", "token_rewards - beta * kl, 0.0)",
      "token_rewards + beta * kl, 0.0)", "KL in the reward paid as a bonus", *T_TOK, *DIRECTION_KL_REWARD),
    M("reward-token-off-by-one", "baton/algos/token_rewards.py", "amax(-1)  # [B]; -1 = empty row",
      "amax(-1) - 1  # [B]; -1 = empty row", "the score lands one token before the last", *T_TOK,
      *DIRECTION_GAE),
    M("adaptive-kl-direction", "baton/algos/kl_control.py", "self.value *= 1.0 + error * n_steps / self.horizon",
      "self.value *= 1.0 - error * n_steps / self.horizon", "adaptive KL: beta falls when the KL is too high",
      *T_KLCTL),
    M("whiten-biased-var", "baton/algos/masked.py", "        var = var * n / (n - 1).clamp(min=1)",
      "        var = var", "whitening with the biased variance", *T_MASKED, *DIRECTION_RPP),
    # --- off-policy corrections (baton/algos/off_policy.py) -----------------------------------
    M("tis-untruncated", "baton/algos/off_policy.py", "    weights = ratio.clamp(max=cap)  # [B, R]",
      "    weights = ratio  # [B, R]", "TIS: the cap ignored", *T_OFF, *DIRECTION_OFF_POLICY),
    M("decoupled-truncates", "baton/algos/off_policy.py",
      "weights = torch.where(ratio > cap, torch.zeros_like(ratio), ratio)  # [B, R]",
      "weights = ratio.clamp(max=cap)  # [B, R]", "decoupled PPO truncates instead of dropping", *T_OFF,
      *DIRECTION_OFF_POLICY),
    M("off-policy-ratio-inverted", "baton/algos/off_policy.py", "proximal.float() - behaviour.float(), 0.0)",
      "behaviour.float() - proximal.float(), 0.0)", "w = mu / pi_prox", *T_OFF, *DIRECTION_OFF_POLICY),
    # --- critic loss (baton/algos/value.py) ---------------------------------------------------
    M("value-clip-min", "baton/algos/value.py", "        err = torch.maximum(err, err_clipped)  # [B, R]",
      "        err = torch.minimum(err, err_clipped)  # [B, R]", "value clipping: the optimistic bound", *T_VAL),
    M("value-loss-detached", "baton/algos/value.py", "torch.where(response_mask.bool(), 0.5 * err, zero)",
      "torch.where(response_mask.bool(), 0.5 * err.detach(), zero)",
      "the critic loss carries no gradient (a detach added)", *T_VAL, *DIRECTION_GAE),
    # --- DPO, pairs, DAPO, RPO (algos) ----------------------------------------------------------
    M("dpo-sigmoid-sign", "baton/algos/dpo.py", "z = beta * (chosen_logratios - rejected_logratios)  # [P]",
      "z = beta * (rejected_logratios - chosen_logratios)  # [P]", "DPO prefers the rejected", *T_DPO,
      *DIRECTION_DPO),
    M("dpo-ref-dropped", "baton/algos/dpo.py",
      "chosen_lr = upcast(chosen_logps) - upcast(ref_chosen_logps.detach())  # [P] (>= float32)",
      "chosen_lr = upcast(chosen_logps)  # [P] (>= float32)", "DPO: the chosen side's reference term dropped",
      *T_DPO, *DIRECTION_DPO),
    M("ipo-target-sign", "baton/algos/dpo.py", "return (h - 1 / (2 * beta)) ** 2",
      "return (h + 1 / (2 * beta)) ** 2", "IPO: the margin target's sign", *T_DPO),
    M("hinge-sign", "baton/algos/dpo.py", "return torch.relu(1 - beta * (chosen_logratios - rejected_logratios))",
      "return torch.relu(1 + beta * (chosen_logratios - rejected_logratios))", "hinge: the margin's sign", *T_DPO),
    M("best-worst-swapped", "baton/algos/pairs.py",
      "PreferencePairs((base + first_hi)[keep], (base + first_lo)[keep], diff[keep],",
      "PreferencePairs((base + first_lo)[keep], (base + first_hi)[keep], diff[keep],",
      "best/worst pairs: the worst row is chosen", *T_PAIRS, *DIRECTION_DPO),
    M("all-pairs-ties", "baton/algos/pairs.py", "keep = diff > margin  # [n, G, G]; NaN compares False",
      "keep = diff >= margin  # [n, G, G]; NaN compares False", "all pairs: ties (and a row with itself) paired",
      *T_PAIRS),
    M("dapo-keeps-ties", "baton/algos/dapo.py", "    return spread > 0", "    return spread >= 0",
      "dynamic sampling keeps tied groups", *T_DAPO, *DIRECTION_DAPO),
    M("overlong-sign", "baton/algos/dapo.py", "return -exceed / buffer_len * penalty_factor  # [B]",
      "return exceed / buffer_len * penalty_factor  # [B]", "overlong shaping rewards length", *T_DAPO),
    M("rpo-nll-sign", "baton/algos/rpo.py", "per_pair = -upcast(chosen_logps) / chosen_lengths.float().clamp(min=1)",
      "per_pair = upcast(chosen_logps) / chosen_lengths.float().clamp(min=1)", "RPO's NLL term lowers the chosen",
      *T_RPO),
    # --- the PPO-family driver (baton/trainers/ppo.py) --------------------------------------------
    M("ppo-gae-negated", PPO,
      "            for hook in after:  # the declared roles'",
      "            batch[F.ADVANTAGES] = -batch[F.ADVANTAGES]\n            for hook in after:  # the declared roles'",
      "the issue's mutant: the estimator's advantages negated in the driver", *DIRECTION_GAE, *DIRECTION_GRPO),
    M("ppo-offpolicy-dropped", ROLE_SPECS,
      "        batch[F.ADVANTAGES] = batch[F.ADVANTAGES] * weights",
      "        pass",
      "the issue's mutant: the TIS / decoupled weights never reach the update", *DIRECTION_OFF_POLICY),
    M("ppo-offpolicy-twice", ROLE_SPECS,
      "        batch[F.ADVANTAGES] = batch[F.ADVANTAGES] * weights",
      "        batch[F.ADVANTAGES] = batch[F.ADVANTAGES] * weights * weights",
      "the off-policy weight applied twice", *DIRECTION_OFF_POLICY),
    M("ppo-kl-reward-unpaid", PPO,
      "token_rewards, kl = kl_in_reward(token_rewards,", "_, kl = kl_in_reward(token_rewards,",
      "KL in the reward measured but never subtracted", *DIRECTION_KL_REWARD),
    M("rollout-groups-merged", "baton/workers/rollout.py", "group=groups[c.prompt_index], prompt_row",
      "group=groups[0], prompt_row", "every row of the step in one group: the baseline over the batch, not the prompt",
      *DIRECTION_GRPO),
    M("remax-baseline-misaligned", PPO, "[F.REWARDS].repeat_interleave(n)  # [B]", "[F.REWARDS].repeat(n)  # [B]",
      "ReMax: each prompt's greedy reward on another prompt's rows", *DIRECTION_REMAX),
    M("dapo-filter-unapplied", PPO, "        kept.append(rows.rows(rows_keep))", "        kept.append(rows)",
      "DAPO: tied groups kept in the batch", *DIRECTION_DAPO),
    M("rm-score-subtracted", ROLE_SPECS, "reward_term=lambda cfg, rows: cfg.reward_model.weight * rows[RM_SCORE]",
      "reward_term=lambda cfg, rows: -cfg.reward_model.weight * rows[RM_SCORE]", "the reward model's score subtracted",
      "tests/trainers/test_ppo_pieces.py"),
    # --- workers ----------------------------------------------------------------------------------
    M("actor-kl-coef-dropped", "baton/workers/actor.py",
      "kl_estimator=algo.kl_estimator, kl_coef=algo.kl_coef,", "kl_estimator=algo.kl_estimator, kl_coef=0.0,",
      "the actor ignores algo.kl_coef", *DIRECTION_KL_LOSS),
    M("actor-clip-keys-swapped", "baton/algos/policy_loss.py",
      'hyper={"clip_low": "clip_low", "clip_high": "clip_high",',
      'hyper={"clip_low": "clip_high", "clip_high": "clip_low",',
      "ppo_clip declares clip_low as clip_high", *DIRECTION_CLIP),
    M("critic-fits-old-values", "baton/workers/critic.py", "returns=mc[F.RETURNS].to(values.device),",
      "returns=mc[F.VALUES].to(values.device),", "the critic's target is its own old values",
      "tests/workers/test_critic.py", *DIRECTION_GAE),
    M("reference-temperature", "baton/workers/reference.py",
      "batched_logprobs(self.model, batch, self.micro_batch_size, self.temperature)",
      "batched_logprobs(self.model, batch, self.micro_batch_size, 2 * self.temperature)",
      "the reference's logprobs at another temperature (pi != ref at step 1)", *DIRECTION_KL_LOSS),
    M("logits-off-by-one", "baton/workers/sequences.py", ".logits[:, P - 1:P + R - 1]  # [B, R, X]",
      ".logits[:, P:P + R]  # [B, R, X]", "the trainer scores each response token with the next position's logits",
      "tests/workers/test_sequences.py"),
    M("dpo-actor-sides-swapped", "baton/workers/dpo_actor.py",
      "chosen_logps=seq[0::2][real], rejected_logps=seq[1::2][real], **ref,",
      "chosen_logps=seq[1::2][real], rejected_logps=seq[0::2][real], **ref,",
      "the DPO actor reads the pair's rows the wrong way round", *DIRECTION_DPO),
    M("staleness-one-more", "baton/sources/ahead.py", "self.pushed + 1 + self.k):", "self.pushed + 2 + self.k):",
      "the generator runs one step further ahead than max_staleness allows",
      "tests/trainers/test_async.py::test_staleness_zero_reproduces_the_sync_run_exactly"),
    # --- the observation mask of agent episodes and gateway sessions ------------------------------
    M("episode-observations-trained", "baton/agents/tokens.py", "mask += [1 if s.kind == POLICY else 0] * len(s.ids)",
      "mask += [1] * len(s.ids)", "agent episodes: observation tokens marked as the policy's", *DIRECTION_MASK),
    M("gateway-observations-trained", "baton/services/gateway.py", "        s.mask += [0] * len(inserted)",
      "        s.mask += [1] * len(inserted)", "gateway sessions: inserted tokens marked as the policy's",
      *DIRECTION_MASK),
    M("actor-loss-unmasked", "baton/workers/actor.py", "response_mask=micro[F.RESPONSE_MASK].float(),",
      "response_mask=(micro[F.RESPONSE_MASK].cummax(-1).values * micro[F.RESPONSE_MASK].flip(-1).cummax(-1)"
      ".values.flip(-1)).float(),", "the actor's loss fills the mask's holes (observations get a gradient)",
      *DIRECTION_MASK),
    # --- DPO drivers, sources -------------------------------------------------------------------
    M("online-dpo-pairs-swapped", "baton/trainers/online_dpo.py",
      "batch = pair_rows(rows, pairs.chosen, pairs.rejected,", "batch = pair_rows(rows, pairs.rejected, pairs.chosen,",
      "online DPO trains the worse sample as chosen", *DIRECTION_DPO),
    M("offline-pairs-swapped", "baton/sources/pairs.py", "for text in (c, r)]", "for text in (r, c)]",
      "offline DPO encodes the rejected text as chosen", *DIRECTION_DPO),
    # --- SFT and the reward model -----------------------------------------------------------------
    M("sft-label-off-by-one", "baton/trainers/sft.py", "[[IGNORE] * plen + ids[plen:] for ids, plen in examples]",
      "[[IGNORE] * (plen - 1) + ids[plen - 1:] for ids, plen in examples]",
      "SFT trains the last prompt token as a target", *DIRECTION_SFT),
    M("sft-ascends-nll", "baton/trainers/sft.py", "    return functional.cross_entropy(logits[:, :-1]",
      "    return -functional.cross_entropy(logits[:, :-1]", "SFT maximises the NLL", *DIRECTION_SFT),
    M("bt-margin-sign", "baton/trainers/reward_model.py", "    margin = chosen - rejected  # [N]",
      "    margin = rejected - chosen  # [N]", "Bradley-Terry prefers the rejected", *DIRECTION_DPO),
    M("rm-scores-swapped", "baton/trainers/reward_model.py", "return scores[:len(pairs)], scores[len(pairs):]",
      "return scores[len(pairs):], scores[:len(pairs)]", "the reward model reads chosen as rejected",
      *DIRECTION_DPO),
    M("rm-task-pairs-swapped", "baton/trainers/reward_model.py",
      '"chosen": task.target(r), "rejected": wrong_answer(task.target(r), rng)}',
      '"chosen": wrong_answer(task.target(r), rng), "rejected": task.target(r)}',
      "the task's pairs prefer the wrong answer", *DIRECTION_DPO),
    # --- the reward runner's aggregation (baton/rewards/runner.py) --------------------------------
    M("reward-weights-dropped", "baton/rewards/runner.py",
      "totals = [sum(w * per_fn[name][i] for name, (_, w) in self.fns.items()) for i in range(n)]",
      "totals = [sum(per_fn[name][i] for name, (_, w) in self.fns.items()) for i in range(n)]",
      "the reward functions' weights ignored", "tests/rewards/test_runner.py"),
    # --- on-policy distillation ------------------------------------------------------------------
    M("distill-sign", "baton/algos/distill.py",
      "gap = teacher_logprobs.detach().float() - old_logprobs.detach().float()",
      "gap = old_logprobs.detach().float() - teacher_logprobs.detach().float()",
      "distillation's advantage is +reverse KL: the student moves away from its teacher",
      "tests/algos/test_distill.py", "tests/trainers/test_distill.py::test_the_student_moves_toward_its_teacher"),
    M("distill-teacher-is-student", "baton/algos/distill.py",
      "gap = teacher_logprobs.detach().float() - old_logprobs.detach().float()",
      "gap = old_logprobs.detach().float() - old_logprobs.detach().float()",
      "the teacher's logprobs never reach the advantage (no signal)",
      "tests/algos/test_distill.py", "tests/trainers/test_distill.py::test_the_student_moves_toward_its_teacher"),
    # --- mixture-of-experts routing replay ------------------------------------------------------
    M("moe-replay-ignored", "baton/models/moe.py",
      "index = torch.where(free, index, g.clamp(min=0))", "index = torch.where(free, index, index)",
      "routing replay routes by the trainer's own experts, not the recorded ones", "tests/test_moe.py"),
    M("moe-replay-gate-detached", "baton/models/moe.py",
      "probs = torch.softmax(logits.float(), dim=-1)\n    top = probs.gather(-1, index)",
      "probs = torch.softmax(logits.float().detach(), dim=-1)\n    top = probs.gather(-1, index)",
      "the replayed experts' gate weights carry no gradient to the router", "tests/test_moe.py"),
    M("moe-replay-position-shifted", "baton/models/moe.py",
      "out[:, :, prompt_width - 1:prompt_width - 1 + R] = routing.permute(2, 0, 1, 3)",
      "out[:, :, prompt_width:prompt_width + R] = routing.permute(2, 0, 1, 3)[:, :, :R]",
      "a token's recorded experts replayed one position late (at the token, not at what predicts it)",
      "tests/test_moe.py"),
]

SMOKE = ("ppo-gae-negated", "ppo-offpolicy-dropped", "grpo-sign", "dpo-sigmoid-sign", "kl-reward-sign")


def check(mutants: list[Mutant]) -> list[str]:
    """Problems with the list: an original snippet absent or not unique, a duplicate id."""
    out, ids = [], set()
    for m in mutants:
        if m.id in ids:
            out.append(f"{m.id}: duplicate id")
        ids.add(m.id)
        path = REPO / m.file
        text = path.read_text() if path.is_file() else ""
        count = text.count(m.original)
        if count != 1:
            out.append(f"{m.id}: its original snippet occurs {count} times in {m.file} (must be once)")
        if m.original == m.replacement:
            out.append(f"{m.id}: replacement equals the original")
        if not m.tests:
            out.append(f"{m.id}: no tests")
    return out


def scratch_copy() -> Path:
    """The working tree's tracked + untracked-not-ignored files, copied to a temp dir."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    dest = Path(tempfile.mkdtemp(prefix="baton-mutants-"))
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
        elif src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dest / rel)
    return dest


NO_TESTS = 5  # pytest's exit status when nothing ran (e.g. a selection that is `slow`): not a kill
ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "RAY_AUTH_MODE": "disabled",
       "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}


def pytest_args(tests: tuple[str, ...]) -> list[str]:
    return ["-x", "-q", "-n", "0", "-p", "no:cacheprovider", *tests]


def run_tests(root: Path, tests: tuple[str, ...], timeout: float, fork: bool) -> tuple[int, float, str]:
    """pytest on `tests` in the copy: (exit status, seconds, the output's tail). `fork`: in a
    child of this process, which imported torch and pytest once (not baton: the child imports
    the mutated copy), saving each run the ~10-20 s of importing them; else a fresh
    interpreter."""
    start = time.perf_counter()
    out = tempfile.NamedTemporaryFile(prefix="baton-mutant-", suffix=".log", delete=False)
    try:
        if fork:
            rc = _forked_pytest(root, tests, timeout, out.fileno())
        else:
            env = {**os.environ, **ENV, "PYTHONPATH": str(root)}
            try:
                rc = subprocess.run([sys.executable, "-m", "pytest", *pytest_args(tests)], cwd=root, env=env,
                                    stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        out.close()
        text = Path(out.name).read_text(errors="replace")
    finally:
        os.unlink(out.name)
    if rc == 124:
        text += f"\ntimed out after {timeout:g}s"
    return rc, time.perf_counter() - start, text[-3000:]


def _forked_pytest(root: Path, tests: tuple[str, ...], timeout: float, fd: int) -> int:
    pid = os.fork()
    if pid == 0:  # the child: the copy first on sys.path, output to the log, then pytest
        code = 1
        try:
            os.setpgid(0, 0)  # a group of its own: a timeout kills what the tests started too
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(root)
            os.environ.update({**ENV, "PYTHONPATH": str(root)})
            sys.path[:] = [str(root)] + [p for p in sys.path if Path(p or ".").resolve() != REPO]
            import pytest

            code = int(pytest.main(pytest_args(tests)))
        except BaseException:  # noqa: BLE001 -- the child must never return into the parent's code
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    end = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1
        if time.monotonic() > end:
            try:
                os.killpg(pid, 9)
            except OSError:
                pass
            os.waitpid(pid, 0)
            return 124
        time.sleep(0.2)


def first_failure(tail: str) -> str:
    for line in tail.splitlines():
        if line.startswith(("FAILED", "ERROR")) or line.startswith("E "):
            return line.strip()[:160]
    return tail.strip().splitlines()[-1][:160] if tail.strip() else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    ap.add_argument("--smoke", action="store_true", help=f"run the smoke set only: {', '.join(SMOKE)}")
    ap.add_argument("--list", action="store_true", help="print the list and exit")
    ap.add_argument("--check", action="store_true", help="check the list against the code and exit")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per pytest run (a timeout is a kill)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--no-fork", action="store_true",
                    help="a fresh interpreter per pytest run (default: a fork of this one, torch imported once)")
    args = ap.parse_args(argv)

    problems = check(MUTANTS)
    if args.check or problems:
        for p in problems:
            print(p, file=sys.stderr)
        if not problems:
            print(f"{len(MUTANTS)} mutants, every snippet present once")
        return 2 if problems else 0
    chosen = MUTANTS
    if args.smoke:
        chosen = [m for m in MUTANTS if m.id in SMOKE]
    if args.only:
        unknown = set(args.only) - {m.id for m in MUTANTS}
        if unknown:
            print(f"unknown mutant id(s): {sorted(unknown)}", file=sys.stderr)
            return 2
        chosen = [m for m in MUTANTS if m.id in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.id:32s} {m.file}: {m.description}\n{'':32s} tests: {' '.join(m.tests)}")
        return 0

    fork = not args.no_fork and hasattr(os, "fork")
    if fork:  # imported once here, inherited by every forked run (baton is not: each run imports the copy)
        os.environ.update(ENV)
        import pytest  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    root = scratch_copy()
    start = time.perf_counter()
    results = []
    try:
        selections = sorted({t for m in chosen for t in m.tests})
        rc, secs, tail = run_tests(root, tuple(selections), args.timeout * 4, fork)
        print(f"baseline: {len(selections)} selections, rc={rc}, {secs:.0f}s", flush=True)
        if rc != 0:
            print(tail, file=sys.stderr)
            print("the unmutated tree fails its selections: fix that first", file=sys.stderr)
            return 1
        for i, m in enumerate(chosen, 1):
            path = root / m.file
            original = path.read_text()
            path.write_text(original.replace(m.original, m.replacement, 1))
            try:
                rc, secs, tail = run_tests(root, m.tests, args.timeout, fork)
            finally:
                path.write_text(original)
            killed = rc not in (0, NO_TESTS)
            results.append({**asdict(m), "killed": killed, "rc": rc, "seconds": round(secs, 1),
                            "by": first_failure(tail) if killed else ""})
            word = "killed  " if killed else "NO TESTS" if rc == NO_TESTS else "SURVIVED"
            print(f"[{i}/{len(chosen)}] {word} {m.id:32s} {secs:5.0f}s  {results[-1]['by']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = time.perf_counter() - start
    killed = sum(r["killed"] for r in results)
    print(f"\nscore: {killed}/{len(results)} killed ({100 * killed / max(len(results), 1):.0f}%), "
          f"{total:.0f}s in all")
    for r in results:
        if not r["killed"]:
            print(f"  survived: {r['id']} ({r['file']}): {r['description']}")
    if args.out:
        args.out.write_text(json.dumps({"score": [killed, len(results)], "seconds": round(total),
                                        "results": results}, indent=1))
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
