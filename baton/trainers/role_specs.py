"""The roles a PPO-family run may build, one registry (`ROLES`) like the row sources'
(`baton.sources.SOURCES`): each entry declares its worker, its config section, the columns
it adds to a step's rows and when a run needs it, so the config (`PPOConfig.roles`), the
placement (`build_roles`) and the driver's step (`baton.trainers.ppo`) loop over the
declared roles instead of testing each one by name.

    role          worker                         section        adds                      a run needs it
    actor         workers.actor:ActorWorker      actor          old_logprobs (proximal)   always
    rollout       workers.rollout:RolloutWorker  rollout        the rows                  always
    reward        workers.reward:RewardWorker    reward         rewards, reward_errors,.. reward.functions and the
                                                                                          source's rows arrive unscored
    reference     workers.reference:...          model          ref_logprobs              algo.kl_coef > 0 or kl_in_reward
    reward_model  workers.reward_model:...       reward_model   reward/model              a reward_model: section
    teacher       workers.teacher:TeacherWorker  teacher        teacher_logprobs (+top-k) the estimator reads a teacher
    critic        workers.critic:CriticWorker    critic         values                    the estimator reads values

Registration order is build order (the actor first: the colocated rollout engine takes its
`Policy` handle) and the order of the step's score calls. The score phase calls a role's
`score` method on the step's rows unless they carry its columns already (a generator that
ran the reward role on its own pool, DAPO's dynamic sampling, which scored them): "scored"
is that one fact, the `rewards` column. A new role (a process reward model, a second
teacher) is one `ROLES.add(name, RoleSpec(...))` in a module imported before the run is
configured (docs/EXTENDING.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from baton import fields as F
from baton.registry import Registry
from baton.workers.reward_model import RM_SCORE

REWARD_COUNTS = ("reward_errors", "reward_timeouts")  # the reward role's failure counts [B]


def _always(cfg: Any) -> bool:
    return True


def _no_args(cfg: Any, probe_prompt: str) -> tuple[tuple, dict]:
    return (), {}


@dataclass(frozen=True)
class RoleSpec:
    """A role and what it does in a step, declared once where it is registered.

    worker       "module:Class" of its worker, imported when a run builds it
    section      the config section it is configured by ("" none of its own)
    columns      the columns its `score` call adds to the step's rows
    needed       cfg -> whether a run builds it
    args         (cfg, probe_prompt) -> (args, kwargs) of its worker
    score        the method the score phase calls on the step's rows (a future; "" none)
    score_if     cfg -> whether the step calls `score` (the actor: proximal logprobs only
                 with algo.recompute_old_logprobs or an off-policy correction)
    rewards      its columns are the reward's: DAPO's dynamic sampling and ReMax's greedy
                 baseline run it too
    reward_term  (cfg, rows) -> what it adds to the rows' scalar reward [B] (None: nothing)
    after        (cfg, rows) -> metrics, after the advantages, when `score_if` (it may weigh
                 the advantages: the actor's off-policy correction)
    update       the method launched beside the actor's update ("" none: the critic's)
    checkpoint   the prefix of its checkpoint beside the actor's step_N ("" none: critic_step_)
    """
    worker: str
    section: str = ""
    columns: tuple[str, ...] = ()
    needed: Callable[[Any], bool] = _always
    args: Callable[[Any, str], tuple[tuple, dict]] = _no_args
    score: str = ""
    score_if: Callable[[Any], bool] = _always
    rewards: bool = False
    reward_term: Callable[[Any, Any], Any] | None = None
    after: Callable[[Any, Any], dict[str, float]] | None = None
    update: str = ""
    checkpoint: str = ""


ROLES: Registry = Registry("role")


def role_specs(names: Any) -> list[tuple[str, RoleSpec]]:
    """(name, spec) of the registered roles among `names`, in registration order (a role
    that is no registry entry, such as placement's "policy_weights", is left out)."""
    return [(name, spec) for name, spec in ROLES.items() if name in names]


# --- the built-in roles: their arguments and step hooks -----------------------------------
def _actor_args(cfg: Any, probe_prompt: str) -> tuple[tuple, dict]:
    r = cfg.rollout
    return (cfg.model, cfg.actor, cfg.algo), dict(temperature=r.temperature, max_new_tokens=r.max_new_tokens,
                                                  total_steps=cfg.trainer.steps, seed=cfg.trainer.seed)


def _rollout_args(cfg: Any, probe_prompt: str) -> tuple[tuple, dict]:
    # rows from servers `baton launch` started (data.source=api): rollout.weight_sync is the
    # servers'; this engine only evaluates, beside the actor
    return (cfg.rollout,), dict(task=cfg.data.task, seed=cfg.trainer.seed, probe_prompt=probe_prompt,
                                verifier_timeout_s=cfg.reward.timeout_s,
                                **({"weight_sync": "auto"} if cfg.source.launched else {}))


def _reference_args(cfg: Any, probe_prompt: str) -> tuple[tuple, dict]:
    a = cfg.actor  # logprobs in the actor's precision
    return (cfg.model,), dict(temperature=cfg.rollout.temperature, micro_batch_size=a.micro_batch_size,
                              strategy=a.strategy, bf16=a.bf16)


def _teacher_args(cfg: Any, probe_prompt: str) -> tuple[tuple, dict]:
    from baton.algos.distill import DISTILL_LOSSES
    from baton.workers.teacher import vocab_rows

    a = cfg.actor  # the reference's machinery on the teacher's model
    return (cfg.teacher,), dict(temperature=cfg.rollout.temperature, micro_batch_size=a.micro_batch_size,
                                strategy=a.strategy, topk=DISTILL_LOSSES[cfg.algo.distill_loss].topk(cfg.algo),
                                vocab_size=vocab_rows(cfg.model.path))


def _critic_args(cfg: Any, probe_prompt: str) -> tuple[tuple, dict]:
    return (cfg.critic, cfg.model), dict(total_steps=cfg.trainer.steps, seed=cfg.trainer.seed,
                                         max_new_tokens=cfg.rollout.max_new_tokens)


def _proximal(cfg: Any) -> bool:
    """The trainer's own (proximal) logprobs at the step's start: PPO's "old" ones, and what
    the rows' behaviour logprobs are weighed against (algo.off_policy)."""
    from baton.algos.off_policy import off_policy_needs

    return cfg.algo.recompute_old_logprobs or off_policy_needs(cfg.algo.off_policy).proximal


def _off_policy(cfg: Any, batch: Any) -> dict[str, float]:
    """mu (the engine; older when generated ahead) against the trainer's pi_prox: the
    correction's metrics, and its weights on the advantages (w * loss(A) = loss(w * A):
    baton.trainers.ppo's docstring)."""
    from baton.algos.off_policy import OFF_POLICY, off_policy_needs
    from baton.algos.registry import hyper_args

    name = cfg.algo.off_policy  # given the keys it declares (cap: algo.off_policy_cap)
    weights, stats = OFF_POLICY[name](batch[F.OLD_LOGPROBS], batch[F.ROLLOUT_LOGPROBS], batch[F.RESPONSE_MASK],
                                      **hyper_args(off_policy_needs(name).hyper, cfg.algo))
    if weights is not None:
        batch[F.ADVANTAGES] = batch[F.ADVANTAGES] * weights
    return {k: v.item() for k, v in stats.items()}


def _distill_metrics(cfg: Any, batch: Any) -> dict[str, float]:
    """How far the student is from the teacher, on its own samples."""
    from baton.algos.distill import distill_metrics

    return distill_metrics(batch[F.OLD_LOGPROBS], batch[F.TEACHER_LOGPROBS], batch[F.RESPONSE_MASK])


def _critic_metrics(cfg: Any, batch: Any) -> dict[str, float]:
    from baton.algos import explained_variance, masked_mean

    mask = batch[F.RESPONSE_MASK]
    return {"critic/explained_var": explained_variance(batch[F.VALUES], batch[F.RETURNS], mask).item(),
            "critic/returns_mean": masked_mean(batch[F.RETURNS], mask).item()}


def _reward_needed(cfg: Any) -> bool:
    return bool(cfg.reward.functions) and not cfg.source.scored


def _kl_needed(cfg: Any) -> bool:
    return cfg.algo.kl_coef > 0 or cfg.algo.kl_in_reward


def _estimator_reads(column: str) -> Callable[[Any], bool]:
    """A role the run needs when its estimator declares it reads `column` (the config check
    refuses the role's section without such an estimator, and such an estimator without it)."""
    def needed(cfg: Any) -> bool:
        from baton.algos import estimator_needs

        return column in estimator_needs(cfg.algo.advantage).inputs
    return needed

ROLES.add("actor", RoleSpec("baton.workers.actor:ActorWorker", "actor", (F.OLD_LOGPROBS,), args=_actor_args,
                            score="compute_logprobs", score_if=_proximal, after=_off_policy))
ROLES.add("rollout", RoleSpec("baton.workers.rollout:RolloutWorker", "rollout", args=_rollout_args))
ROLES.add("reward", RoleSpec("baton.workers.reward:RewardWorker", "reward", (F.REWARDS, *REWARD_COUNTS),
                             needed=_reward_needed, args=lambda cfg, _: ((cfg.reward,), {}),
                             score="compute_rewards", rewards=True))
ROLES.add("reference", RoleSpec("baton.workers.reference:ReferenceWorker", "model", (F.REF_LOGPROBS,),
                                needed=_kl_needed, args=_reference_args, score="compute_ref_logprobs"))
ROLES.add("reward_model", RoleSpec("baton.workers.reward_model:RewardModelWorker", "reward_model", (RM_SCORE,),
                                   needed=lambda cfg: cfg.reward_model is not None,
                                   args=lambda cfg, _: ((cfg.reward_model,), {}), score="compute_rm_scores",
                                   rewards=True, reward_term=lambda cfg, rows: cfg.reward_model.weight * rows[RM_SCORE]))
ROLES.add("teacher", RoleSpec("baton.workers.teacher:TeacherWorker", "teacher", (F.TEACHER_LOGPROBS,),
                              needed=_estimator_reads(F.TEACHER_LOGPROBS), args=_teacher_args,
                              score="compute_teacher_logprobs", after=_distill_metrics))
ROLES.add("critic", RoleSpec("baton.workers.critic:CriticWorker", "critic", (F.VALUES,),
                             needed=_estimator_reads(F.VALUES), args=_critic_args, score="compute_values",
                             after=_critic_metrics, update="update_critic", checkpoint="critic_step_"))

__all__ = ["REWARD_COUNTS", "ROLES", "RoleSpec", "role_specs"]
