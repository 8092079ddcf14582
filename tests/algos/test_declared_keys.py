"""Every registry entry declares the `algo.*` keys it reads, and the config's refusals derive
from those declarations (`baton.algos.config.dependent_keys`): a new entry that declares a
key makes that key read under its name, with no list edited by hand."""

import pytest
import torch

from baton.algos.config import AlgoConfig, check_algo_dependencies, check_algo_names, declared_keys
from baton.algos.distill import DISTILL_LOSSES, distill_advantages, register_distill_loss
from baton.algos.kl_control import KL_CONTROLLER_HYPER, KL_CONTROLLERS, build_kl_controller, register_kl_controller
from baton.algos.off_policy import OFF_POLICY, OFF_POLICY_NEEDS, off_policy_needs, register_off_policy


@pytest.fixture
def cleanup():
    added = []
    yield added
    for registry, side, name in added:
        dict.pop(registry, name, None)
        if side is not None:
            side.pop(name, None)


def test_the_sampled_distillation_form_is_an_entry():
    form = DISTILL_LOSSES["advantage"]
    assert form.sampled and form.keys == () and form.topk(AlgoConfig(distill_topk=8)) is None
    assert DISTILL_LOSSES["jsd"].keys == ("distill_beta", "distill_topk")
    assert DISTILL_LOSSES["reverse_kl"].topk(AlgoConfig(distill_topk=8)) == 8
    check_algo_names(AlgoConfig(advantage="grpo", distill_loss="advantage"))  # a name like any other
    with pytest.raises(ValueError, match=r"'advantage', 'forward_kl', 'jsd', 'reverse_kl'"):
        check_algo_names(AlgoConfig(advantage="grpo", distill_loss="nope"))
    s, t = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-0.5, -2.5]])
    adv, _ = distill_advantages(old_logprobs=s, teacher_logprobs=t, response_mask=torch.ones(1, 2))
    assert adv.tolist() == [[0.5, -0.5]]  # the sampled form: log teacher - log student


def test_a_new_distillation_loss_reads_the_keys_it_declares(cleanup):
    @register_distill_loss("scaled_rkl", hyper={"beta": "distill_beta"})
    def scaled_rkl(*, student, teacher, beta):
        return beta * DISTILL_LOSSES["reverse_kl"](student=student, teacher=teacher)

    cleanup.append((DISTILL_LOSSES, None, "scaled_rkl"))
    algo = AlgoConfig(advantage="distill", distill_loss="scaled_rkl", distill_beta=0.3, distill_topk=4)
    check_algo_dependencies(algo)  # distill_beta and distill_topk are read: it declares them
    terms = DISTILL_LOSSES["scaled_rkl"].terms(torch.zeros(1, 1, 2), torch.log(torch.tensor([[[0.25, 0.75]]])), algo)
    assert terms.shape == (1, 1) and terms.item() > 0
    with pytest.raises(ValueError, match=r"algo.distill_beta=0.3 is read only with algo.distill_loss=jsd/scaled_rkl"):
        check_algo_dependencies(AlgoConfig(advantage="distill", distill_loss="reverse_kl", distill_beta=0.3))


def test_kl_controllers_and_off_policy_corrections_declare_their_keys(cleanup):
    assert declared_keys()["kl_controller"]["adaptive"] == ["kl_reward_coef", "kl_target", "kl_horizon"]
    ctl = build_kl_controller(AlgoConfig(kl_in_reward=True, kl_controller="adaptive", kl_target=0.5, kl_horizon=7))
    assert (ctl.target_kl, ctl.horizon) == (0.5, 7)

    @register_kl_controller("slow", hyper={"kl_coef": "kl_reward_coef", "horizon": "kl_horizon"})
    class Slow(KL_CONTROLLERS["fixed"]):
        def __init__(self, kl_coef, horizon):
            super().__init__(kl_coef / horizon)

    cleanup.append((KL_CONTROLLERS, KL_CONTROLLER_HYPER, "slow"))
    check_algo_dependencies(AlgoConfig(kl_in_reward=True, kl_controller="slow", kl_horizon=5))  # it declares it
    with pytest.raises(ValueError, match=r"algo.kl_target=0.5 is read only with algo.kl_controller=adaptive"):
        check_algo_dependencies(AlgoConfig(kl_in_reward=True, kl_controller="slow", kl_target=0.5))
    assert build_kl_controller(AlgoConfig(kl_in_reward=True, kl_controller="slow", kl_horizon=5)).value == 0.001 / 5

    assert not off_policy_needs("none").proximal and off_policy_needs("tis").proximal

    @register_off_policy("capped_none", hyper={"cap": "off_policy_cap"}, proximal=False)
    def capped_none(proximal_logprobs, behaviour_logprobs, response_mask, cap):
        return None, {}

    cleanup.append((OFF_POLICY, OFF_POLICY_NEEDS, "capped_none"))
    check_algo_dependencies(AlgoConfig(off_policy="capped_none", off_policy_cap=3.0))
    with pytest.raises(ValueError, match=r"off_policy_cap=3.0 is read only with algo.off_policy=tis/decoupled_ppo/capped"):
        check_algo_dependencies(AlgoConfig(off_policy="none", off_policy_cap=3.0))
