"""A step without signal, made visible: the share of groups whose rewards all tie.

A group-relative estimator (GRPO, Dr. GRPO, RLOO, ...) gives a group whose samples all scored
the same reward an advantage of zero: it teaches nothing. When most groups of a step tie
(every sample wrong, every sample right, or a reward that never varies), the loss is ~0 and the
run learns nothing, silently. `tied_group_frac` is the share of such groups (logged every step
as `reward/tied_group_frac`, TRL's `frac_reward_zero_std`); `TiedGroups` warns once, naming the
reward functions, when a step's share is above one half, and counts such steps after
(`reward/tied_steps`, continued from metrics.jsonl when a run resumes).

    tied = TiedGroups(cfg)                       # in the driver, before the loop
    metrics.update(tied.check(step, rewards, group_index))
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from baton.algos.advantages import group_inverse
from baton.runs.metrics_log import METRICS_FILE, read_metrics

log = logging.getLogger("baton")

MOST = 0.5  # warn when more than this share of a step's groups tie
TOL = 1e-6  # rewards closer than this are equal


def _group_range(rewards: torch.Tensor, group_index: torch.Tensor, tol: float) -> tuple[torch.Tensor, ...]:
    """Per group (rows with the same `group_index`): (highest reward, lowest reward, tied:
    spread <= tol) [G] each. rewards [B], group_index [B]."""
    inverse, n_groups = group_inverse(len(rewards), group_index)  # [B], G
    r = rewards.float()
    hi = torch.full((n_groups,), -torch.inf).scatter_reduce(0, inverse, r, "amax")  # [G]
    lo = torch.full((n_groups,), torch.inf).scatter_reduce(0, inverse, r, "amin")  # [G]
    return hi, lo, (hi - lo) <= tol


def tied_group_frac(rewards: torch.Tensor, group_index: torch.Tensor, tol: float = TOL) -> float:
    """Share of groups (rows with the same `group_index`) whose rewards span at most `tol`:
    their group-relative advantage is zero. rewards [B], group_index [B]; a group of one row
    is tied (nothing to compare it with)."""
    return _group_range(rewards, group_index, tol)[2].float().mean().item()


def tied_at(rewards: torch.Tensor, group_index: torch.Tensor, tol: float = TOL) -> tuple[float, float]:
    """(share of groups tied at the step's highest reward, share tied at its lowest): every
    sample right (nothing left to learn there) vs every sample wrong (no sample to learn from).
    rewards [B], group_index [B]."""
    hi, lo, tied = _group_range(rewards, group_index, tol)  # [G] each
    top, bottom = (tied & (hi >= rewards.max() - tol)), (tied & (lo <= rewards.min() + tol))  # [G]
    return top.float().mean().item(), (bottom & ~top).float().mean().item()


def tied_steps_logged(path: Path, before: int) -> int:
    """Steps before `before` that metrics.jsonl records as mostly tied (0 without a log)."""
    return sum(rec.get("step", before) < before and rec.get("reward/tied_group_frac", 0) > MOST
               for rec in read_metrics(path))


def reward_names(cfg: Any) -> list[str]:
    """What scores a PPO-family run's rows: its reward functions (unless its row source scores
    its own rows: an agent's env, a gateway's agent, the trajectory API's environments, which
    leave `reward.functions` unread) and its reward model."""
    source = getattr(cfg, "source", None)
    scored = bool(getattr(source, "scored", False))
    names = [] if scored else list(getattr(getattr(cfg, "reward", None), "functions", {}) or {})
    if getattr(cfg, "reward_model", None) is not None:
        names.append(f"reward model {cfg.reward_model.path}")
    if scored:
        names.insert(0, f"data.source={cfg.data.source}'s own scores")
    return names or ["the source's own scores"]


class TiedGroups:
    """The per-step metric, one warning the first time most groups tie, then a count."""

    def __init__(self, cfg: Any) -> None:
        from baton.algos import estimator_needs

        self.names = reward_names(cfg)
        self.group_relative = estimator_needs(cfg.algo.advantage).compares_groups(cfg.algo)  # it compares a prompt's samples
        self.metrics_path = Path(cfg.trainer.run_dir) / METRICS_FILE
        self.steps: int | None = None  # steps in which most groups tied (read at the first check)
        self.warned = False

    def check(self, step: int, rewards: torch.Tensor, group_index: torch.Tensor) -> dict[str, float]:
        frac = tied_group_frac(rewards, group_index)
        out = {"reward/tied_group_frac": frac}
        if not self.group_relative or frac <= MOST:
            return out
        if self.steps is None:  # a resumed run goes on counting (the log holds only steps before this one now)
            self.steps = tied_steps_logged(self.metrics_path, before=step)
        self.steps += 1
        out["reward/tied_steps"] = self.steps
        if not self.warned:
            self.warned = True
            top, bottom = tied_at(rewards, group_index)
            hint = ("most of them score the step's highest reward: the prompts may be too easy for the policy now "
                    "(harder data, or DAPO's algo.dynamic_sampling=true keeps only groups with a signal)"
                    if top > bottom else "check the reward on a few completions (samples.jsonl in the run dir)")
            log.warning("step %d: %.0f%% of groups have tied rewards (zero advantage: nothing to learn from them; "
                        "%.0f%% all at the step's highest reward, %.0f%% all at its lowest); rewards from %s: %s. "
                        "Said once; reward/tied_steps counts such steps in metrics.jsonl",
                        step, 100 * frac, 100 * top, 100 * bottom, ", ".join(self.names), hint)
        return out
