"""`baton.workers.optimizer_steps`, the optimizer loop every trainable role runs: hand-worked
on a linear model (micro-batches sum to the mini-batch's gradient, the norm is reported
before clipping, a non-finite loss skips the step and leaves the weights alone), and the
three roles (GRPO actor, DPO actor, critic) honour `offload` and report the same keys.

No role holds gradients after its update, offload or not (the rollout that follows needs
the memory); on a CPU-only machine `offload` moves nothing more (the optimizer state is on
the CPU already). The role tests check both."""

import math

import pytest
import torch

from baton.algos.dpo_config import DPOLossConfig
from baton.batch import Batch
from baton.controller import Dispatch, ResourcePool, WorkerGroup, register
from baton.models.config import ModelConfig
from baton.models.make import make_tiny_checkpoint
from baton.models.parallel import wrap
from baton.workers.actor import ActorConfig, ActorWorker
from baton.workers.critic import CriticConfig, CriticWorker
from baton.workers.dpo_actor import DPOActorWorker, pair_rows
from baton.workers.optimizer_steps import OptimizerSteps, step_seed


def linear_steps(grad_clip=1e9, offload=False, lr=0.1):
    model = torch.nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -1.0]], dtype=torch.float64))
    optim = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 0.5)  # lr 0.05 after its step
    steps = OptimizerSteps(optim, sched, wrap(model, None, "ddp"), torch.device("cpu"), grad_clip,
                           offload=offload, prefix="role")
    return model, steps


def run(model, steps, x, y, micro, mini=4):
    """Loss = sum over rows of (w.x - y)^2 / 4 (a global normaliser of 4 rows)."""
    def loss(mc, _):
        return ((model(mc["x"])[:, 0] - mc["y"]) ** 2).sum() / 4
    return steps.run(Batch({"x": x, "y": y}), epochs=1, mini=mini, micro=micro, seed=0, version=0,
                     shuffle=lambda b, s: b, prepare=lambda mb: None, loss=loss)


X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]], dtype=torch.float64)
Y = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64)


def test_one_step_by_hand_and_micro_batches_sum():
    # w = (1, -1): residuals w.x - y = (1, -1, -1, 1); loss = 4 / 4 = 1
    # grad = sum 2 r x / 4 = ((2*1*1) + (2*-1*1) + (2*1*2)) / 4 , ((2*-1*1) + (2*-1*1)) / 4 = (1, -1)
    for micro in (4, 1):
        model, steps = linear_steps()
        metrics, n = run(model, steps, X, Y, micro=micro)
        assert n == 1
        assert metrics["role/loss"] == pytest.approx(1.0, abs=1e-12)
        assert metrics["role/grad_norm"] == pytest.approx(math.sqrt(2), abs=1e-12)
        assert metrics["role/lr"] == pytest.approx(0.05)  # the schedule stepped once, after
        assert metrics["role/nonfinite_skipped"] == 0.0
        # SGD at the LR before the schedule's step (0.1 * 0.5 = 0.05): w - 0.05 * (1, -1)
        torch.testing.assert_close(model.weight.detach(), torch.tensor([[0.95, -0.95]], dtype=torch.float64),
                                   atol=1e-12, rtol=0)


def test_clipping_reports_the_norm_before_it_and_steps_with_the_clipped_gradient():
    model, steps = linear_steps(grad_clip=math.sqrt(2) / 2)  # half the norm
    metrics, _ = run(model, steps, X, Y, micro=2)
    assert metrics["role/grad_norm"] == pytest.approx(math.sqrt(2), abs=1e-12)
    coef = (math.sqrt(2) / 2) / (math.sqrt(2) + 1e-6)  # torch's clip: max_norm / (norm + 1e-6)
    step = 0.05 * coef
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1 - step, -1 + step]], dtype=torch.float64),
                               atol=1e-12, rtol=0)


def test_a_non_finite_loss_skips_only_its_step_and_offload_frees_the_gradients():
    model, steps = linear_steps(offload=True)
    y = Y.clone()
    y[0] = float("nan")  # the first mini-batch of 2 rows is poisoned; the second is not
    metrics, n = run(model, steps, X, y, micro=1, mini=2)
    assert n == 2 and metrics["role/nonfinite_skipped"] == 1.0
    assert math.isnan(metrics["role/loss"])
    # only rows 2, 3 stepped: r = (-1, 1); grad = (2*-1*(1,1) + 2*1*(2,0)) / 4 = (0.5, -0.5)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[0.975, -0.975]], dtype=torch.float64),
                               atol=1e-12, rtol=0)
    assert model.weight.grad is None  # nothing held between updates


def test_no_gradient_is_held_after_an_update_without_offload():
    model, steps = linear_steps()
    run(model, steps, X, Y, micro=2)
    assert model.weight.grad is None


def test_step_seed_is_the_formula_every_role_used():
    assert step_seed(3, 2, 1) == 3 * 1_000_003 + 2 * 101 + 1


# --- the three roles -------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=1))


class _Held:
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def grads_held(self) -> int:
        return sum(p.grad is not None for p in self.model.parameters())


class ActorProbe(_Held, ActorWorker):
    pass


class DPOProbe(_Held, DPOActorWorker):
    pass


class CriticProbe(_Held, CriticWorker):
    pass


def rows(n=4, P=3, R=4, vocab=50) -> Batch:
    from baton import fields as F

    g = torch.Generator().manual_seed(0)
    return Batch({F.PROMPT_IDS: torch.randint(4, vocab, (n, P), generator=g),
                  F.PROMPT_MASK: torch.ones(n, P, dtype=torch.long),
                  F.RESPONSE_IDS: torch.randint(4, vocab, (n, R), generator=g),
                  F.RESPONSE_MASK: torch.ones(n, R, dtype=torch.long),
                  F.OLD_LOGPROBS: -torch.rand(n, R, generator=g), F.ADVANTAGES: torch.randn(n, R, generator=g),
                  F.REF_LOGPROBS: -torch.rand(n, R, generator=g), F.VALUES: torch.zeros(n, R),
                  F.RETURNS: torch.rand(n, R, generator=g)})


def build(role, model_dir, offload):
    pool = ResourcePool(1)
    if role == "critic":
        g = WorkerGroup(pool, CriticProbe, CriticConfig(offload=offload), ModelConfig(path=model_dir),
                        total_steps=2, seed=0, max_new_tokens=4)
        return g, lambda b: g.update_critic(b).get()[0], "critic", "critic/vf_loss"
    actor = ActorConfig(offload=offload, micro_batch_size=2)
    if role == "dpo":
        g = WorkerGroup(pool, DPOProbe, ModelConfig(path=model_dir), actor, DPOLossConfig(),
                        temperature=1.0, max_new_tokens=4, total_steps=2, seed=0)
        return g, lambda b: g.update_dpo(pair_rows(b, torch.tensor([0, 2]), torch.tensor([1, 3])))[0], \
            "actor", "actor/loss"
    from baton.algos.config import AlgoConfig

    g = WorkerGroup(pool, ActorProbe, ModelConfig(path=model_dir), actor, AlgoConfig(),
                    temperature=1.0, max_new_tokens=4, total_steps=2, seed=0)
    return g, lambda b: g.update(b)[0], "actor", "actor/loss"


@pytest.mark.parametrize("role", ["actor", "dpo", "critic"])
def test_every_role_honours_offload_and_reports_the_same_keys(model_dir, role):
    held = {}
    for offload in (False, True):
        group, update, prefix, loss_key = build(role, model_dir, offload)
        try:
            metrics = update(rows())
            held[offload] = group.grads_held()[0]
        finally:
            group.shutdown()
        for k in (loss_key, f"{prefix}/grad_norm", f"{prefix}/lr", f"{prefix}/nonfinite_skipped"):
            assert k in metrics and math.isfinite(metrics[k]), k
        assert metrics[f"{prefix}/nonfinite_skipped"] == 0.0
    assert held == {False: 0, True: 0}  # no gradients held after the update, offload or not
