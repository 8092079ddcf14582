"""Devices at one boundary (baton.controller.devices, HostCore.call) and the precision
defaults (baton.models.precision), checked on the CPU.

No GPU here: the worker's device is set to `meta`, PyTorch's device without storage, which
refuses to mix with CPU tensors exactly as CUDA does ("... is not on the expected device"),
so a move that is missing, or done twice, shows up without CUDA. The CUDA runs themselves
are tests/gpu/.
"""

from __future__ import annotations

import pytest
import torch

from baton import fields as F
from baton.batch import PAD_KEY, Batch
from baton.controller import Dispatch, Worker, register
from baton.controller.devices import to_driver, to_worker
from baton.controller.dispatch import Topology
from baton.controller.worker import HostCore
from baton.models.precision import memory_metrics, memory_phase, resolve_bf16

META = torch.device("meta")


def rows(n: int = 4) -> Batch:
    return Batch({F.RESPONSE_MASK: torch.ones(n, 3), "x": torch.arange(n)}, {"text": ["a"] * n})


def test_on_the_cpu_nothing_moves_or_is_copied():
    b = rows()
    args, kwargs = to_worker((b, 3), {"batch": b}, torch.device("cpu"))
    assert args[0] is b and kwargs["batch"] is b
    out = {"m": 1.0, "b": b}
    assert to_driver(out, torch.device("cpu")) is out


def test_batches_go_to_the_worker_device_and_nothing_else_moves():
    b, t = rows(), torch.ones(2)
    (moved, n, tensor), kwargs = to_worker((b, 3, t), {"other": b}, META)
    assert moved.tensors["x"].device == META and kwargs["other"].tensors["x"].device == META
    assert list(moved.non_tensors["text"]) == ["a"] * 4  # text stays as it is
    assert n == 3 and tensor is t  # only Batch arguments cross


def test_results_come_back_on_the_cpu():
    b = rows()
    out = to_driver({"b": b, "t": [torch.ones(1)], "m": 2.0}, META)
    assert out["b"] is b  # already on the CPU: not copied
    assert out["t"][0].device.type == "cpu" and out["m"] == 2.0


class Probe(Worker):
    """Records the device of what it receives; returns a Batch of its own."""

    seen: list[torch.device]

    def __init__(self) -> None:
        self.seen = []

    @register(dispatch=Dispatch.DP_COMPUTE)
    def work(self, batch: Batch) -> Batch:
        self.seen.append(batch[F.RESPONSE_MASK].device)
        return Batch({"y": torch.zeros(len(batch))})


class TextProbe(Probe):
    batch_on_device = False  # e.g. reward functions: the batch stays where it was sent


def host_on(device: torch.device) -> HostCore:
    """A host whose slot's device is `device` (set directly: `setup` would need CUDA)."""
    host = HostCore("test", Topology(1, (1, 1, 1)), rank=0, chain_errors=True)
    host.device = device
    return host


@pytest.mark.parametrize("cls, expected", [(Probe, META), (TextProbe, torch.device("cpu"))])
def test_a_worker_call_moves_its_batch_once_and_returns_on_the_cpu(monkeypatch, cls, expected):
    host = host_on(META)
    host.create("probe", cls, (), {})
    moves = []
    real_to = Batch.to
    monkeypatch.setattr(Batch, "to", lambda self, *a, **k: moves.append(a) or real_to(self, *a, **k))
    b = rows()
    b.meta[PAD_KEY] = 1
    out = host.call("probe", "work", Dispatch.DP_COMPUTE.value, (b,), {})
    assert host.roles["probe"].seen == [expected]
    assert len(moves) == (1 if expected == META else 0)  # once, and only for a device role
    assert out["y"].device.type == "cpu" and out.meta[PAD_KEY] == 1  # padding still propagated


def test_padding_rows_are_masked_on_the_batch_device():
    """Regression: the dispatch-padding mask was built on the CPU and multiplied into a mask
    on the worker's device (the first thing a GPU update did)."""
    from baton.workers.actor import ActorWorker

    b = rows()
    b.meta[PAD_KEY] = 1
    masked = ActorWorker._mask_padding(b.to(META))
    assert masked[F.RESPONSE_MASK].device == META


def test_bf16_defaults_follow_the_device():
    assert resolve_bf16(None, "cpu") is False
    assert resolve_bf16(None, torch.device("cuda", 0)) is True
    assert resolve_bf16(True, "cpu") is True and resolve_bf16(False, "cuda") is False


def test_peak_memory_is_cuda_only():
    with memory_phase("update", torch.device("cpu")):
        torch.ones(1000)
    assert memory_metrics() == {}


# --- the colocated engine: its dtype and its sleep between calls ---------------------------
@pytest.fixture(scope="module")
def roles(tmp_path_factory):
    from tests.workers.conftest import colocated_roles

    return colocated_roles(tmp_path_factory)


def test_on_the_cpu_the_engine_reads_the_actor_in_place_in_fp32(roles):
    groups, pool = roles
    host = pool.backend.host
    actor, rollout = host.roles["actor"], host.roles["rollout"]
    assert actor.bf16 is False and actor.policy.compute_dtype is None  # actor.bf16: None on the CPU
    assert not rollout.own_weights and rollout.engine.model is actor.model


def test_the_engine_sleeps_between_calls_and_every_entry_wakes_it(roles):
    groups, pool = roles
    engine = pool.backend.host.roles["rollout"].engine
    prompts = Batch(non_tensors={F.PROMPT_TEXT: ["1+2=", "3+4="], "answer": ["3", "7"]})
    for step in range(2):  # the second call finds the engine asleep (its KV cache released)
        out = groups["rollout"].generate(prompts, step)
        assert len(out) == 4 and engine._asleep
    acc = groups["rollout"].evaluate([{"prompt": "1+2=", "answer": "3"}], True)["accuracy"]
    assert 0.0 <= acc <= 1.0 and engine._asleep
    assert max(groups["rollout"].sync_weights(1, check=True)) < 1e-4  # fp32 on the CPU: exact parity


def test_a_bf16_policy_with_fp32_weights_gets_a_bf16_engine_copy(roles):
    """What a GPU run does (actor.bf16 resolves true there): the engine samples from a bf16
    copy refilled at each sync. Asked here of the policy directly (no CUDA)."""
    from dataclasses import replace

    from baton.workers.rollout import RolloutWorker

    policy = roles[1].backend.host.roles["actor"].policy
    gpu_like = replace(policy, compute_dtype=torch.bfloat16)
    assert RolloutWorker.engine_dtype(gpu_like, "auto") == torch.bfloat16
    assert RolloutWorker.engine_dtype(gpu_like, "copy") == torch.bfloat16
    assert RolloutWorker.engine_dtype(gpu_like, "inplace") is None  # asked for the module itself
    assert RolloutWorker.engine_dtype(policy, "auto") is None  # fp32 compute: read in place


# --- TF32 on a GPU slot: both of torch's APIs stay readable ------------------------------
TF32_PROBE = """
import torch
from baton.controller.devices import enable_tf32, tf32_on
m, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
enable_tf32(torch.device("cpu"))  # nothing on the CPU
print(torch.get_float32_matmul_precision(), m.allow_tf32, m.fp32_precision)
tf32_on()  # what enable_tf32 does on CUDA (the flags exist in a CPU build of torch)
print(torch.get_float32_matmul_precision(), m.allow_tf32, cudnn.allow_tf32)
print(m.fp32_precision, cudnn.conv.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)
"""


def test_tf32_is_set_so_the_legacy_and_new_apis_both_read_it():
    """Regression: setting only the new API (`matmul.fp32_precision = "tf32"`) made every
    legacy read (`torch.get_float32_matmul_precision()`, which inductor calls) raise "mix of
    the legacy and new APIs" (torch 2.13). Run apart: the flags are process-wide."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", TF32_PROBE], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split("\n")[:3] == ["highest False none", "high True True", "tf32 tf32 none"]


# --- model.dtype=bfloat16: fp32 master weights, bf16 compute ------------------------------
def test_a_bf16_weight_drops_an_adamw_sized_update():
    """Why master weights (hand-worked): bf16 keeps 8 bits of mantissa, so next to 1.0 the
    step is 2^-7 = 0.0078; an update of 1e-3 (AdamW at lr 1e-3) rounds away, fp32 keeps it."""
    from baton.models.precision import master_dtype

    w = torch.ones(1, dtype=torch.bfloat16)
    assert (w - 1e-3).item() == 1.0
    assert (w.to(master_dtype(torch.bfloat16)) - 1e-3).item() == pytest.approx(0.999)
    assert master_dtype(torch.float64) == torch.float64 and master_dtype(torch.float32) == torch.float32


def test_model_dtype_bf16_trains_fp32_master_weights_in_bf16(tmp_path_factory):
    """Regression: `model.dtype=bfloat16` made AdamW update bf16 weights directly (small
    updates round away), without a word. Now the actor holds fp32 weights, computes in bf16
    (autocast, as `actor.bf16`), and the engine samples from a bf16 copy; the reference
    (frozen) would hold bf16."""
    from tests.workers.conftest import colocated_roles

    _, pool = colocated_roles(tmp_path_factory, "model.dtype=bfloat16")
    actor, rollout = pool.backend.host.roles["actor"], pool.backend.host.roles["rollout"]
    assert {p.dtype for p in actor.model.parameters()} == {torch.float32}
    assert actor.bf16 and actor.policy.compute_dtype == torch.bfloat16
    assert rollout.own_weights and {p.dtype for p in rollout.engine.model.parameters()} == {torch.bfloat16}


def test_a_lora_base_keeps_model_dtype_and_its_adapters_train_in_fp32(tmp_path_factory):
    """LoRA's base is frozen: bf16 as asked (the memory it saves); the adapters are fp32."""
    from tests.workers.conftest import colocated_roles

    _, pool = colocated_roles(tmp_path_factory, "model.dtype=bfloat16", "model.lora.rank=4", "model.lora.alpha=8")
    actor = pool.backend.host.roles["actor"]
    trained = {p.dtype for p in actor.model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in actor.model.parameters() if not p.requires_grad}
    assert trained == {torch.float32} and frozen == {torch.bfloat16}


def test_the_engine_generates_with_no_gradient_held_after_an_update(roles, monkeypatch):
    """Generate, update the actor, generate again: at each engine call no actor parameter
    holds a gradient (freed after the update, offload or not: `OptimizerSteps.run`)."""
    groups, pool = roles
    host = pool.backend.host
    actor, engine = host.roles["actor"], host.roles["rollout"].engine
    held, generate = [], engine.generate

    def counting(*args, **kwargs):  # a spy on the real engine: counts, then generates
        held.append(sum(p.grad is not None for p in actor.model.parameters()))
        return generate(*args, **kwargs)

    monkeypatch.setattr(engine, "generate", counting)
    prompts = Batch(non_tensors={F.PROMPT_TEXT: ["1+2=", "3+4="], "answer": ["3", "7"]})
    batch = groups["rollout"].generate(prompts, 0)
    mask = batch[F.RESPONSE_MASK]
    batch[F.OLD_LOGPROBS] = groups["actor"].compute_logprobs(batch).get()[F.OLD_LOGPROBS]
    batch[F.ADVANTAGES] = torch.linspace(-1, 1, len(batch))[:, None] * mask
    metrics = groups["actor"].update(batch)[0]
    assert metrics["actor/grad_norm"] > 0  # the update did make gradients
    groups["rollout"].generate(prompts, 1)
    assert held == [0, 0]


@pytest.mark.parametrize("device, role, model_dtype, bf16, want", [
    ("cuda", "frozen", torch.float32, True, torch.bfloat16),  # the reference / LoRA base on a GPU
    ("cuda", "frozen", torch.float32, False, torch.float32),  # actor.bf16=false: the same precision as the actor
    ("cuda", "frozen", torch.float64, True, torch.float64),  # asked for
    ("cuda", "frozen", torch.bfloat16, True, torch.bfloat16),
    ("cpu", "frozen", torch.float32, False, torch.float32),  # the CPU: fp32 unless asked
    ("cpu", "frozen", torch.float32, True, torch.float32),
    ("cpu", "frozen", torch.bfloat16, True, torch.bfloat16),
    ("cuda", "trained", torch.float32, True, torch.float32),  # master weights
    ("cuda", "trained", torch.bfloat16, True, torch.float32),
    ("cpu", "trained", torch.float64, False, torch.float64),
])
def test_weights_dtype_by_device_role_and_model_dtype(device, role, model_dtype, bf16, want):
    from baton.models.precision import weights_dtype

    assert weights_dtype(device, role, model_dtype, bf16) == want


def test_weights_dtype_refuses_an_unknown_role():
    from baton.models.precision import weights_dtype

    with pytest.raises(ValueError, match="'trained' or 'frozen'"):
        weights_dtype("cuda", "reference", torch.float32, True)


def test_the_frozen_roles_load_the_dtype_the_rule_gives(tmp_path, monkeypatch):
    """Where the rule is applied: the reference (and the actor's LoRA base) load what
    `weights_dtype` answers for their device. The rule is swapped for one that answers
    float64 (a stand-in for its CUDA answer, bf16, which the CPU never gets), so a role that
    ignored it would not pass."""
    import baton.workers.actor as actor_mod
    import baton.workers.reference as reference_mod
    from baton.models.config import ModelConfig
    from baton.models.lora import LoraAdapterConfig
    from baton.models.make import make_tiny_checkpoint
    from baton.workers.reference import ReferenceWorker

    asked = []

    def rule(device_type, role, model_dtype, bf16):
        asked.append((device_type, role))
        return torch.float64 if role == "frozen" else model_dtype

    model_dir = str(make_tiny_checkpoint(tmp_path / "tiny", preset="0.75m", seed=1))
    monkeypatch.setattr(reference_mod, "weights_dtype", rule)
    ref = ReferenceWorker(ModelConfig(path=model_dir), temperature=1.0, micro_batch_size=2)
    assert {p.dtype for p in ref.model.parameters()} == {torch.float64} and asked == [("cpu", "frozen")]
    monkeypatch.setattr(actor_mod, "weights_dtype", rule)
    assert actor_mod.ActorWorker.weights_dtype(ModelConfig(path=model_dir, lora=LoraAdapterConfig(rank=4)), torch.device("cpu"),
                                               False) == torch.float64
    assert actor_mod.ActorWorker.weights_dtype(ModelConfig(path=model_dir), torch.device("cpu"), False) == torch.float32
