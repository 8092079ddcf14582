"""Device faults caught on the CPU: the recipe matrix's rows (tests/test_recipe_matrix.py's
ROWS) run 2 steps with every worker on a device of its own (`DeviceFaultMode`,
tests/device_fault_mode.py: the workers get cpu:1, whose tensors may not meet CPU tensors in
one op, as CUDA's may not) and bf16 on, as a GPU run has it. A missing move, a tensor built
on the host beside a device tensor, fails here with the op's name instead of on a GPU.

Host reads of device tensors (`.item()`, `.tolist()`, `bool(t)`, `.cpu()`: what a GPU waits
for) are counted while the engine generates and while the actor updates, and held to a
budget per generated token and per step. As on a GPU, frozen weights (a LoRA base) are bf16
(`baton.models.precision.weights_dtype` answers for the worker's device as for "cuda"), and
the engine's decode steps are "graph" steps, each replay checked on the CPU (tests/graph_replay.py:
a replay that would read a storage other than its capture's, or a capture that syncs, fails the
row). The rows that need Ray (other processes: the mode
lives in this one) and the `slow` rows are left out; the default run takes a representative
subset (one row per driver and source kind), the rest run under `slow`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import math

import pytest
import torch

from baton.cli import main
from baton.metrics import read_metrics
from tests.device_fault_mode import WORKER, DeviceFaultMode
from tests.graph_replay import ReplayChecker
from tests.test_recipe_matrix import REPO, ROWS, AGENTS

DEFAULT = {"grpo", "grpo-lora", "ppo-critic", "online-dpo", "agent-calculator", "agent-gateway", "sft"}  # one per driver / source
IN_PROCESS = {"sft", "rm", "sft-calc-format", "sft-calc-mixed"}  # trainer.bf16, trainer.device


def _rows():
    for rid, recipe, overrides, marks in ROWS:
        if "ray" in marks or "slow" in marks:
            continue
        mark = [] if rid in DEFAULT else [pytest.mark.slow]
        yield pytest.param(rid, recipe, overrides, id=rid, marks=mark)


@pytest.fixture
def mode(monkeypatch):
    """Workers on WORKER (cpu:1) under a DeviceFaultMode; the engine's generation and the
    actor's update counted as regions; frozen weights in a GPU's dtype; graph replays checked
    (`m.replays`)."""
    import baton.controller.worker as worker
    import baton.workers.actor as actor
    import baton.workers.reference as reference
    from baton.models.precision import weights_dtype
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.rollout.embedded.generation import Generation
    from baton.workers.actor import ActorWorker

    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(AGENTS))
    monkeypatch.setenv("BATON_PLACEMENT_AUTO", "0")
    monkeypatch.setattr(worker, "_device_for", lambda use_cuda, local_rank: WORKER)
    for module in (actor, reference):  # the workers' device answers as a GPU's does
        monkeypatch.setattr(module, "weights_dtype", lambda device_type, *a: weights_dtype("cuda", *a))
    m = DeviceFaultMode()
    m.replays = ReplayChecker().install(monkeypatch)
    tokens, calls, steps, active = [0], [0], [0], threading.local()

    def engine(self, *a, _real=EmbeddedEngine.__init__, **k):  # the GPU's decode: static steps, a host look every 8
        _real(self, *a, **{**k, "static_decode": k.get("static_decode", True), "sync_every": k.get("sync_every") or 8})

    def advance(self, *a, _real=Generation.advance, **k):
        entered = contextlib.ExitStack()
        if not getattr(active, "on", False):  # a function mode is per thread: agents generate on a thread of their own
            active.on = True
            entered.callback(setattr, active, "on", False)
            entered.enter_context(m)
        with entered, m.in_region("generate"):
            done = _real(self, *a, **k)
        if done and self.result is not None:
            tokens[0] += sum(len(c.token_ids) for c in self.result)
            calls[0], steps[0] = calls[0] + 1, steps[0] + self.steps
        return done

    @functools.wraps(ActorWorker.update)  # keeps its registration (dispatch mode)
    def update(self, *a, _real=ActorWorker.update, **k):
        with m.in_region("update"):
            return _real(self, *a, **k)

    monkeypatch.setattr(Generation, "advance", advance)
    monkeypatch.setattr(EmbeddedEngine, "__init__", engine)
    monkeypatch.setattr(ActorWorker, "update", update)
    threads = torch.get_num_threads()
    m.tokens, m.calls, m.steps, m.active = tokens, calls, steps, active
    active.on = True  # the test's own thread enters it
    yield m
    torch.set_num_threads(threads)


@pytest.mark.parametrize("rid, recipe, overrides", list(_rows()))
def test_a_row_runs_on_a_device_of_its_own(rid, recipe, overrides, mode, tmp_path):
    extra = ["trainer.bf16=true", "trainer.device=cpu:1"] if rid in IN_PROCESS else ["actor.bf16=true"]
    with mode:
        code = main(["train", f"recipes/{recipe}.yaml", *overrides, *extra, f"trainer.run_dir={tmp_path}",
                     "trainer.steps=2"])
    assert code == 0
    lines = [r for r in read_metrics(tmp_path) if "step" in r]
    assert {r["step"] for r in lines} >= {1, 2}
    assert all(math.isfinite(v) for r in lines for v in r.values() if isinstance(v, float))
    reads, calls, steps = dict(mode.reads), mode.calls[0], mode.steps[0]
    # the engine, decoding as on a GPU: one host look every 8 decode steps, and a generation's
    # completions read once at its end (4 reads; 5 with its last look). Measured (2 steps):
    # grpo 30 reads for 6 calls of 4 steps (83 tokens), sft 13 for 2 of 16, the gateway 45 for
    # 9 of 6: one read per 8 steps beyond the calls' own, not one a token.
    assert reads.get("generate", 0) <= 5 * calls + steps // 8 + 2, (reads, mode.where, calls, steps)
    # the actor's update reads its metrics once, at its end: 17 a step (grpo), 8.5 (PPO's actor)
    assert reads.get("update", 0) <= 20 * 2, (reads, mode.where)
    mode.replays.assert_clean()  # every replay of a kept decode graph read what its capture read
    assert mode.replays.replays > 0 or calls == 0


def test_the_mode_faults_on_mixing_and_counts_host_reads():
    """What the rows rely on: a device tensor meeting a host tensor fails as on CUDA (a 0-dim
    host scalar and host indices pass, as there); moves copy; host reads are counted."""
    from tests.device_fault_mode import DeviceFault

    linear = torch.nn.Linear(4, 4)
    mode = DeviceFaultMode()
    with mode:
        linear.to(WORKER)
        x = torch.randn(2, 4).to(WORKER)
        assert x.device == WORKER and linear.weight.device == WORKER
        with mode.in_region("update"):
            linear(x).sum().backward()
            assert linear.weight.grad.device == WORKER  # made by autograd, beside its parameter
            torch.optim.AdamW(linear.parameters()).step()
            assert (x * torch.tensor(2.0)).device == WORKER and x[torch.tensor([1])].shape == (1, 4)
            loss = linear(x).sum().item()
        with pytest.raises(DeviceFault, match="linear mixes worker-device tensors with CPU tensors"):
            linear(torch.randn(2, 4))
        host = x.cpu()
        assert host.device == torch.device("cpu") and host.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        with pytest.raises(DeviceFault):
            host + x
    assert math.isfinite(loss) and mode.reads == {"update": 1, "other": 1}
