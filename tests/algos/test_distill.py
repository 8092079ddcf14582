"""The `distill` estimator (on-policy distillation) on hand-worked numbers, against a
reference computation, and its metrics."""

import math

import torch

from baton.algos import ADVANTAGES, compute_advantages, distill_metrics, estimator_needs
from baton.algos.config import AlgoConfig


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
