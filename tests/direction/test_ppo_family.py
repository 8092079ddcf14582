"""Direction of one real PPO-family step (baton/trainers/ppo.py, local backend, a 0.75M
random model, 4 prompts x 4 samples of <= 4 tokens, the hand-set parity reward of
tests/direction/direction_rewards.py): the advantages the actor's update receives have the
sign and size the estimator's formula gives, and after the update the logprobs of the
rewarded completions rose relative to the penalised ones.

Hand-worked (a group of n = 4 rows with rewards r_i in {0, 1}, mean m, unbiased std s):
    GRPO / DAPO / GSPO   A_i = (r_i - m) / (s + eps)        sign(A_i) = sign(r_i - m)
    Dr. GRPO             A_i = r_i - m                      (exactly; no std)
    RLOO                 A_i = r_i - (sum_j r_j - r_i)/(n-1) = n/(n-1) (r_i - m) = 4/3 (r_i - m)
    REINFORCE++ (gamma 1) A_it = whiten over the batch's tokens of r_i: sign(r_i - token-mean of r)
    ReMax                A_i = r_i - r(the prompt's greedy response)
    PPO + GAE (gamma = lambda = 1, no whitening, reward on the last token, V_T = 0):
        A_t = sum_{l>=0} delta_{t+l} = sum_{l>=t} r_l - V_t = r_i - V_t,  returns_t = r_i
e.g. rewards (1, 0, 0, 1): m = 0.5, s = 0.577: GRPO A = (0.866, -0.866, -0.866, 0.866);
Dr. GRPO (0.5, -0.5, -0.5, 0.5); RLOO (0.667, -0.667, -0.667, 0.667). A group whose rewards
all tie gets A = 0 on every row.

Why the logprobs move as predicted: the update ascends J = sum_{i,t} A_it logp_it / N (token
mean; at the first step the PPO ratio is 1, nothing is clipped). Adam's first step moves each
parameter by lr * sign(dJ/dθ_k) (m / sqrt(v) = g / |g| at step 1), so to first order
dJ = lr * sum_k |dJ/dθ_k| > 0: sum_{i,t} A_it (logp'_it - logp_it) > 0 with the formula's
A. With lr = 1e-3 on this model the second-order terms are small against it (the margins
asserted are positive by a wide factor at this seed). A reversed sign anywhere on the path
(estimator, driver, loss) makes it negative; a dropped advantage makes the update zero.
The rewarded rows' mean logprob change exceeding the penalised rows' is the readable form.
"""

from __future__ import annotations

import math

import pytest
import torch

from baton import fields as F
from baton.config import load_config
from baton.metrics import read_metrics
from baton.models.make import make_tiny_checkpoint
from baton.trainers import ppo
from baton.trainers.ppo_config import PPOConfig

from .harness import REPO, TINY, first_token, observe

N = 4  # rollout.n
CRITIC = ["critic.micro_batch_size=16", "critic.mini_batch_size=16", "critic.lr=1e-5", "critic.pretrain_steps=0"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


def run(model_dir, tmp_path, monkeypatch, *extra, recipe="grpo_arithmetic.yaml"):
    seen = observe(monkeypatch)
    model = [f"model.path={model_dir}"] + ([f"critic.path={model_dir}"] if recipe.startswith("ppo") else [])
    cfg = load_config(PPOConfig, REPO / "recipes" / recipe,
                      [*model, f"trainer.run_dir={tmp_path}", *TINY, "actor.lr=1e-3", *extra])
    ppo.train(cfg)
    return seen


def group_centred(r: torch.Tensor) -> torch.Tensor:
    """[B] r_i - its group's mean."""
    g = r.view(-1, N)
    return (g - g.mean(-1, keepdim=True)).flatten()


def moved_toward(update, oracle_tokens: torch.Tensor) -> None:
    """sum A_it dlogp_it > 0 with the formula's A, and (the readable form) the rows with a
    positive advantage rose more than those with a negative one."""
    mask = update.batch[F.RESPONSE_MASK].double()
    gain = float((oracle_tokens * mask * update.delta_tokens).sum())
    assert gain > 0, f"the update moved against the advantages: sum A dlogp = {gain:.3g}"
    row = (oracle_tokens * mask).sum(-1)
    # the penalised rows; where none is (ReMax when every greedy answer scored 0), the rest
    up, down = update.delta[row > 0], update.delta[row < 0] if (row < 0).any() else update.delta[row == 0]
    assert len(up) and len(down) and up.mean() > down.mean(), (up, down)


def check_sequence_level(update, oracle: torch.Tensor) -> torch.Tensor:
    """The update's advantages have the oracle's sign on every row (0 where it is 0), one
    value per row; the logprobs moved their way. Returns the advantages per row [B]."""
    b = update.batch
    mask = b[F.RESPONSE_MASK].double()
    adv = first_token(b[F.ADVANTAGES], mask).double()
    live = (mask[:, 0] > 0) & (oracle != 0)
    assert live.sum() >= 4, "the seed gave too few rows with a signal"  # fixed seed: fixed rows
    assert torch.equal(torch.sign(adv[live]), torch.sign(oracle[live])), (adv, oracle)
    assert (adv[oracle == 0] == 0).all(), (adv, oracle)
    assert torch.allclose(b[F.ADVANTAGES].double() * mask, adv[:, None] * mask)  # every token carries it
    moved_toward(update, oracle[:, None] * mask)
    return adv


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators(estimator, model_dir, tmp_path, monkeypatch):
    (u,) = run(model_dir, tmp_path, monkeypatch, f"algo.advantage={estimator}").actor
    oracle = group_centred(u.batch[F.REWARDS].double())
    adv = check_sequence_level(u, oracle)
    if estimator == "dr_grpo":
        assert torch.allclose(adv, oracle, atol=1e-6)
    if estimator == "rloo":
        assert torch.allclose(adv, oracle * N / (N - 1), atol=1e-6)
    if estimator == "grpo":  # (r - m) / (s + eps), s unbiased
        s = u.batch[F.REWARDS].double().view(-1, N).std(-1, keepdim=True).expand(-1, N).flatten()
        assert torch.allclose(adv, oracle / (s + 1e-6), atol=1e-4)


def test_dapo_keeps_groups_with_a_signal_and_pushes_them(model_dir, tmp_path, monkeypatch):
    """DAPO: dynamic sampling (tied groups dropped while more can be drawn), clip-higher,
    token-mean; the kept groups' advantages have GRPO's sign."""
    (u,) = run(model_dir, tmp_path, monkeypatch, "algo.dynamic_sampling=true",
               "algo.dynamic_sampling_max_rounds=3").actor
    r = u.batch[F.REWARDS].double()
    check_sequence_level(u, group_centred(r))
    # tied groups were dropped and more drawn: a tied group is left only where the cap was hit
    (step,) = [m for m in read_metrics(tmp_path) if m["step"] == 1]
    tied = int((r.view(-1, N).std(-1) == 0).sum())
    assert tied == step["dapo/groups_filled"], (tied, step)
    assert step["dapo/groups_kept"] == 4 - tied


def test_gspo_pushes_rewarded_rows_up(model_dir, tmp_path, monkeypatch):
    """GSPO: sequence-level ratio (length-normalised); the objective is sum_i A_i/L_i logp_i,
    whose first-order change is positive as the token-level one is."""
    (u,) = run(model_dir, tmp_path, monkeypatch, "algo.policy_loss=gspo", "algo.loss_agg=seq-mean-token-mean").actor
    check_sequence_level(u, group_centred(u.batch[F.REWARDS].double()))


def test_reinforce_pp_whitens_over_the_batch(model_dir, tmp_path, monkeypatch):
    (u,) = run(model_dir, tmp_path, monkeypatch, "algo.advantage=reinforce_pp").actor
    mask = u.batch[F.RESPONSE_MASK].double()
    r = u.batch[F.REWARDS].double()
    mean = float((r[:, None] * mask).sum() / mask.sum())  # every token of row i has return r_i
    check_sequence_level(u, r - mean)


def test_remax_subtracts_the_greedy_reward(model_dir, tmp_path, monkeypatch):
    """A_i = r_i - r(greedy answer of row i's prompt), the baseline recomputed here from the
    greedy texts the rollout returned (the reward is a parity of prompt + completion, so the
    baselines differ from prompt to prompt: each must sit on its own prompt's rows)."""
    from baton.workers.rollout import BASELINE_COMPLETION

    (u,) = run(model_dir, tmp_path, monkeypatch, "algo.advantage=remax", "data.prompts_per_step=8",
               "actor.mini_batch_size=32", "actor.micro_batch_size=32",
               "reward.functions={direction/prompt_parity: 1.0}").actor
    from direction_rewards import prompt_parity  # on sys.path from observe() on
    b = u.batch
    prompts, greedy = list(b["prompt"]), list(b[BASELINE_COMPLETION])
    baseline = torch.tensor([prompt_parity(p, g) for p, g in zip(prompts, greedy)], dtype=torch.float64)
    assert len(set(baseline.view(-1, N)[:, 0].tolist())) == 2, "every prompt's greedy answer scored alike"
    oracle = b[F.REWARDS].double() - baseline
    adv = check_sequence_level(u, oracle)
    assert torch.allclose(adv, oracle, atol=1e-6)


def test_ppo_gae_advantages_are_returns_minus_values_and_the_critic_fits_them(model_dir, tmp_path, monkeypatch):
    """PPO with a critic, gamma = lambda = 1, no whitening: A_t = r_i - V_t, returns_t = r_i
    (module docstring); the actor moves along A; the critic's values move toward the returns
    (one Adam step on 0.5 (V - R)^2 lowers it to first order, as above)."""
    seen = run(model_dir, tmp_path, monkeypatch, *CRITIC, "algo.whiten_advantages=false",
               "algo.gamma=1.0", "algo.lam=1.0", recipe="ppo_arithmetic.yaml")
    (u,), (c,) = seen.actor, seen.critic
    b = u.batch
    mask = b[F.RESPONSE_MASK].double()
    r, values = b[F.REWARDS].double(), b[F.VALUES].double()
    expected = (r[:, None] - values) * mask  # [B, R]
    assert torch.allclose(b[F.ADVANTAGES].double() * mask, expected, atol=1e-5), "A_t != r - V_t"
    assert torch.allclose(b[F.RETURNS].double() * mask, r[:, None] * mask, atol=1e-6)
    moved_toward(u, expected)
    cm = c.batch[F.RESPONSE_MASK].double()
    target = c.batch[F.RETURNS].double()
    err = lambda v: float((((v.double() - target) ** 2) * cm).sum() / cm.sum())  # noqa: E731
    assert torch.allclose(c.before.double() * cm, values * cm, atol=1e-5)  # the values the driver used
    assert err(c.after) < err(c.before), (err(c.before), err(c.after))


def _perturb_behaviour(monkeypatch, factors: torch.Tensor) -> None:
    """The rows' behaviour logprobs mu set to pi / factor per token (row i: factors[i]): as
    if an older or different engine had sampled them. The trainer's proximal logprobs are
    its own (algo.off_policy recomputes them), so w = pi_prox / mu = factor exactly."""
    real = ppo.row_source

    def row_source(*args, **kwargs):
        source = real(*args, **kwargs)
        rows = source.rows

        def perturbed(step, **kw):
            batch = rows(step, **kw)
            mask = batch[F.RESPONSE_MASK].float()
            batch[F.ROLLOUT_LOGPROBS] = batch[F.ROLLOUT_LOGPROBS] - torch.log(factors)[:, None] * mask
            return batch

        source.rows = perturbed
        return source

    monkeypatch.setattr(ppo, "row_source", row_source)


@pytest.mark.parametrize("correction", ["tis", "decoupled_ppo"])
def test_off_policy_weights_scale_the_update_exactly_where_they_are_not_one(correction, model_dir, tmp_path,
                                                                            monkeypatch):
    """Hand-set behaviour logprobs: group 0's rows were 1.5x less likely under mu than under
    the trainer (w = 1.5), group 1's 3x (w = 3 > cap 2: TIS truncates to 2, decoupled PPO
    drops the token, w = 0), the rest untouched (w = 1). The advantages the update receives
    are the estimator's times w, token by token: changed exactly where w != 1."""
    factors = torch.tensor([1.5] * N + [3.0] * N + [1.0] * (2 * N))
    expected_w = {"tis": [1.5, 2.0, 1.0, 1.0], "decoupled_ppo": [1.5, 0.0, 1.0, 1.0]}[correction]
    _perturb_behaviour(monkeypatch, factors)
    raw = []
    real = ppo.compute_advantages
    monkeypatch.setattr(ppo, "compute_advantages", lambda name, **kw: raw.append(real(name, **kw)) or raw[-1])
    (u,) = run(model_dir, tmp_path, monkeypatch, f"algo.off_policy={correction}", "algo.off_policy_cap=2.0").actor
    mask = u.batch[F.RESPONSE_MASK].double()
    estimated = raw[0][0].double() * mask
    w = torch.tensor(expected_w).repeat_interleave(N).double()[:, None]  # [B, 1]
    assert (estimated.abs().sum(-1)[:2 * N] > 0).sum() >= 2, "the seed left groups 0 and 1 without a signal"
    assert torch.allclose(u.batch[F.ADVANTAGES].double() * mask, estimated * w, rtol=1e-4, atol=1e-6)
    # the proximal logprobs are the trainer's own, not the perturbed behaviour ones
    assert torch.allclose(u.batch[F.OLD_LOGPROBS].double() * mask, u.before, atol=1e-4)
    moved_toward(u, estimated * w)


def test_kl_in_the_reward_is_subtracted_per_token(model_dir, tmp_path, monkeypatch):
    """InstructGPT: r_t = [t last] r_i - beta (log pi_old_t - log ref_t) (k1) on real tokens.
    At step 1 pi_old = ref (KL 0); step 2 samples from the updated policy, so the KL is not 0
    and each token's reward must be the hand formula's."""
    beta = 0.5
    seen = run(model_dir, tmp_path, monkeypatch, "trainer.steps=2", "algo.kl_in_reward=true",
               f"algo.kl_reward_coef={beta}", "algo.kl_controller=fixed", "algo.kl_reward_estimator=k1")
    b = seen.actor[1].batch
    mask = b[F.RESPONSE_MASK].double()
    kl = (b[F.OLD_LOGPROBS].double() - b[F.REF_LOGPROBS].double()) * mask
    assert kl.abs().sum() > 1e-4  # the policy moved in step 1
    last = mask * (torch.arange(mask.shape[1]) == (mask * torch.arange(mask.shape[1])).argmax(-1, keepdim=True))
    expected = b[F.REWARDS].double()[:, None] * last - beta * kl
    assert torch.allclose(b[F.TOKEN_REWARDS].double() * mask, expected, atol=1e-5)


def test_kl_in_the_loss_pulls_toward_the_reference(model_dir, tmp_path, monkeypatch):
    """Two runs of two steps from the same seed, kl_coef 0 and 1 (k3). Step 1 is the same in
    both: k3's gradient is 0 where pi = ref (d/dlogpi [e^(ref-logpi) - 1 - (ref-logpi)] =
    1 - e^(ref-logpi) = 0). Step 2 starts from the same weights on the same rows; with the
    KL term its update ends nearer the reference: sum over tokens of (logpi' - ref)^2 is
    smaller."""
    ends = {}
    for coef in (0.0, 1.0):
        seen = run(model_dir, tmp_path / str(coef), monkeypatch, "trainer.steps=2", f"algo.kl_coef={coef}",
                   "algo.kl_estimator=k3")
        ends[coef] = seen.actor[1]
        monkeypatch.undo()
    a, b = ends[0.0], ends[1.0]
    assert torch.equal(a.batch[F.RESPONSE_IDS], b.batch[F.RESPONSE_IDS])  # the same rows
    assert torch.allclose(a.before, b.before, atol=1e-6)  # the same weights after step 1
    ref = b.batch[F.REF_LOGPROBS].double() * b.batch[F.RESPONSE_MASK].double()
    dist = {c: float(((u.after - ref) ** 2).sum()) for c, u in ends.items()}
    assert dist[1.0] < dist[0.0], dist
    assert not math.isclose(dist[1.0], dist[0.0], rel_tol=1e-6)
