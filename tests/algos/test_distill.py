"""The `distill` estimator (on-policy distillation) on hand-worked numbers, against a
reference computation, and its metrics; GKD's full-distribution losses (algo.distill_loss)
by hand, their top-k renormalisation, their direction, and their place in the actor loss."""

import math

import torch

from baton.algos import ADVANTAGES, actor_loss, compute_advantages, distill_metrics, estimator_needs
from baton.algos.config import AlgoConfig
from baton.algos.distill import DISTILL_LOSSES, divergences, jsd_loss, reverse_kl_loss


def _reference(student, teacher, mask):
    """The per-token reverse KL reward, loop by loop: -(log s - log t) on policy tokens, 0 elsewhere."""
    out = torch.zeros_like(student)
    for i in range(student.shape[0]):
        for t in range(student.shape[1]):
            if mask[i, t]:
                out[i, t] = -(student[i, t] - teacher[i, t])
    return out


def test_advantage_is_the_per_token_log_ratio_with_discount_zero():
    # row 0: student log p [-0.1, -2.0, -0.5], teacher [-0.3, -0.2, -0.5]
    #   A = t - s = [-0.2, +1.8, 0.0]: the teacher likes token 1 more (push up), token 0 less
    # row 1: a hole at t=1 (an agent's observation token: mask 0) holding garbage, padding at t=2
    #   A = [-1.0 - (-3.0), 0, 0] = [2.0, 0, 0]; the garbage never leaks in
    student = torch.tensor([[-0.1, -2.0, -0.5], [-3.0, float("nan"), 0.0]])
    teacher = torch.tensor([[-0.3, -0.2, -0.5], [-1.0, -7.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv, ret = ADVANTAGES["distill"](old_logprobs=student, teacher_logprobs=teacher, response_mask=mask)
    expected = torch.tensor([[-0.2, 1.8, 0.0], [2.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(adv, _reference(student.nan_to_num(), teacher, mask), atol=1e-6, rtol=0)
    assert torch.equal(adv, ret)
    # discount 0: a later token's gap never reaches an earlier one (row 0's token 0 keeps its
    # own -0.2 whatever follows it)
    later = teacher.clone()
    later[0, 2] = 5.0
    adv2, _ = ADVANTAGES["distill"](old_logprobs=student, teacher_logprobs=later, response_mask=mask)
    assert torch.equal(adv2[0, :2], adv[0, :2]) and adv2[0, 2] != adv[0, 2]


def test_task_reward_is_group_centred_and_weighted():
    # two rows of one group, rewards [1, 0]: Dr. GRPO centring -> [+0.5, -0.5] on every token,
    # times coef 0.4 -> [+0.2, -0.2], added to the per-token log ratio t - s
    student = torch.tensor([[-1.0, -1.0], [-0.5, -2.0]])
    teacher = torch.tensor([[-0.5, -1.5], [-0.5, -1.0]])  # t - s = [[0.5, -0.5], [0.0, 1.0]]
    mask = torch.ones(2, 2)
    adv, _ = compute_advantages("distill", old_logprobs=student, teacher_logprobs=teacher, response_mask=mask,
                                scores=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]),
                                values=None, task_reward_coef=0.4)
    torch.testing.assert_close(adv, torch.tensor([[0.7, -0.3], [-0.2, 0.8]]), atol=1e-6, rtol=0)


def test_its_expected_policy_gradient_is_minus_the_reverse_kl_gradient():
    """E_{x ~ s}[A(x) grad log s(x)] = -grad KL(s || t) exactly: enumerate every token of a
    V=4 softmax policy at one position, weigh each sampled token's policy gradient by its
    probability, and compare with autograd of the closed-form KL."""
    logits = torch.tensor([0.3, -0.2, 0.9, -1.1], requires_grad=True)
    teacher = torch.log_softmax(torch.tensor([1.0, 0.0, -1.0, 0.5]), -1)
    logs = torch.log_softmax(logits, -1)  # [V]
    expected_pg = torch.zeros(4)
    for x in range(4):
        adv, _ = ADVANTAGES["distill"](old_logprobs=logs.detach()[x].view(1, 1),
                                       teacher_logprobs=teacher[x].view(1, 1), response_mask=torch.ones(1, 1))
        (g,) = torch.autograd.grad(adv[0, 0] * logs[x], logits, retain_graph=True)
        expected_pg += logs.detach()[x].exp() * g
    kl = (logs.exp() * (logs - teacher)).sum()  # KL(s || t), closed form
    (g_kl,) = torch.autograd.grad(kl, logits)
    torch.testing.assert_close(expected_pg, -g_kl, atol=1e-6, rtol=0)
    assert g_kl.abs().max() > 0.01


def test_metrics_by_hand():
    # tokens: (s, t) = (-0.1, -0.3), (-2.0, -0.2), (-0.5, -0.5), (-0.2, -1.5); one padded
    # log s - log t = [0.2, -1.8, 0.0, 1.3] -> mean -0.075
    # teacher mean (-0.3 - 0.2 - 0.5 - 1.5) / 4 = -0.625
    # below (t < s - ln 2 = s - 0.693): only the last (-1.5 < -0.893) -> 0.25
    student = torch.tensor([[-0.1, -2.0, -0.5], [-0.2, 0.0, 0.0]])
    teacher = torch.tensor([[-0.3, -0.2, -0.5], [-1.5, -9.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    m = distill_metrics(student, teacher, mask)
    assert math.isclose(m["distill/reverse_kl"], -0.075, abs_tol=1e-6)
    assert math.isclose(m["distill/teacher_logprob"], -0.625, abs_tol=1e-6)
    assert m["distill/teacher_below"] == 0.25


def test_it_declares_a_teacher_and_reads_the_reward_only_when_mixed():
    needs = estimator_needs("distill")
    assert needs.teacher and not needs.critic and needs.groups
    assert not needs.reads_reward(AlgoConfig()) and not needs.compares_groups(AlgoConfig())
    assert needs.compares_groups(AlgoConfig(task_reward_coef=0.5))
    assert not estimator_needs("grpo").teacher and estimator_needs("grpo").compares_groups(AlgoConfig())


# --- GKD's full-distribution losses (algo.distill_loss) ------------------------------------
def _log(*p):
    return torch.log(torch.tensor([list(p)], dtype=torch.float64))[None]  # [1, 1, K]


def test_divergences_by_hand():
    # one position, two tokens: student (0.5, 0.5), teacher (0.25, 0.75)
    #   reverse KL(s || t) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75)            = 0.5 ln(4/3)
    #   forward KL(t || s) = 0.25 ln(0.25/0.5) + 0.75 ln(0.75/0.5)
    #   jsd, beta 0.5: m = (0.375, 0.625);
    #     0.5 [0.25 ln(0.25/0.375) + 0.75 ln(0.75/0.625)] + 0.5 [0.5 ln(0.5/0.375) + 0.5 ln(0.5/0.625)]
    s, t = _log(0.5, 0.5), _log(0.25, 0.75)
    ln = math.log
    expected = {"reverse_kl": 0.5 * ln(4 / 3), "forward_kl": 0.25 * ln(0.5) + 0.75 * ln(1.5),
                "jsd": 0.5 * (0.25 * ln(2 / 3) + 0.75 * ln(1.2)) + 0.5 * (0.5 * ln(4 / 3) + 0.5 * ln(0.8))}
    assert abs(expected["reverse_kl"] - 0.143841) < 1e-6 and abs(expected["jsd"] - 0.0338225) < 1e-6
    for name, value in expected.items():
        got = DISTILL_LOSSES[name](student=s, teacher=t)
        assert got.shape == (1, 1) and math.isclose(got.item(), value, abs_tol=1e-6), (name, got.item(), value)
    # jsd's beta weighs the teacher: beta 0.25, m = 0.25 t + 0.75 s = (0.4375, 0.5625)
    m = (0.4375, 0.5625)
    by_hand = (0.25 * (0.25 * ln(0.25 / m[0]) + 0.75 * ln(0.75 / m[1]))
               + 0.75 * (0.5 * ln(0.5 / m[0]) + 0.5 * ln(0.5 / m[1])))
    assert math.isclose(jsd_loss(student=s, teacher=t, beta=0.25).item(), by_hand, abs_tol=1e-6)
    for name in expected:  # zero where the student is the teacher
        assert abs(DISTILL_LOSSES[name](student=t, teacher=t).item()) < 1e-6


def test_top_k_renormalises_both_over_the_teachers_tokens():
    # vocabulary of 3: student (0.5, 0.3, 0.2), teacher (0.6, 0.3, 0.1); the teacher's top 2 =
    # tokens 0, 1 -> student (0.625, 0.375), teacher (2/3, 1/3) over them
    s, t = _log(0.5, 0.3), _log(0.6, 0.3)
    by_hand = 0.625 * math.log(0.625 / (2 / 3)) + 0.375 * math.log(0.375 / (1 / 3))
    assert math.isclose(reverse_kl_loss(student=s, teacher=t).item(), by_hand, abs_tol=1e-6)


def test_the_gradient_moves_the_student_toward_the_teacher_and_never_the_teacher():
    """A few gradient steps on the student's logits lower each divergence; the teacher's
    logprobs get no gradient (they are the target)."""
    teacher = torch.log_softmax(torch.tensor([[[2.0, 0.0, -1.0, 0.5]]]), -1).requires_grad_(True)
    for name in divergences():
        logits = torch.tensor([[[0.3, -0.2, 0.9, -1.1]]], requires_grad=True)
        values = []
        for _ in range(5):
            loss = DISTILL_LOSSES[name](student=torch.log_softmax(logits, -1), teacher=teacher).sum()
            values.append(loss.item())
            (g,) = torch.autograd.grad(loss, logits)
            logits = (logits - 1.0 * g).detach().requires_grad_(True)
        assert all(b < a for a, b in zip(values, values[1:])), (name, values)
        assert teacher.grad is None
        out = DISTILL_LOSSES[name](student=torch.log_softmax(logits, -1), teacher=teacher)
        assert not out.requires_grad or teacher not in [n for n in out.grad_fn.next_functions]


def test_with_a_distill_loss_the_advantage_is_the_task_term_only():
    student = torch.tensor([[-1.0, -1.0], [-0.5, -2.0]])
    teacher = torch.tensor([[-0.5, -1.5], [-0.5, -1.0]])
    mask = torch.ones(2, 2)
    adv, _ = ADVANTAGES["distill"](old_logprobs=student, teacher_logprobs=teacher, response_mask=mask,
                                   distill_loss="reverse_kl")
    assert torch.equal(adv, torch.zeros(2, 2))
    adv, _ = compute_advantages("distill", old_logprobs=student, teacher_logprobs=teacher, response_mask=mask,
                                scores=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]),
                                values=None, task_reward_coef=0.4, distill_loss="jsd")
    torch.testing.assert_close(adv, torch.tensor([[0.2, 0.2], [-0.2, -0.2]]), atol=1e-6, rtol=0)


def test_the_loss_term_is_added_to_the_actor_loss():
    # zero advantages: the policy loss is 0, the loss is the distill term's token mean
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    lp = torch.zeros(2, 2)
    distill = torch.tensor([[0.3, 0.6], [0.9, 100.0]])  # the padded token's 100 never counts
    loss, stats = actor_loss(logprobs=lp, old_logprobs=lp, advantages=lp, response_mask=mask, distill=distill)
    assert math.isclose(loss.item(), 0.6, abs_tol=1e-6) and math.isclose(stats["distill_loss"].item(), 0.6, abs_tol=1e-6)
