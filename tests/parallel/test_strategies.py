"""Strategies on real meshes equal the single-process DDP update (baton.models.parallel).

One actor update on a fixed batch (4 prompt groups x 2 samples, ragged responses, shared
prompt forwards) under ddp on 1 rank is the reference; fsdp2 on 2 Ray ranks, tp=2, and
fsdp x tp on 4 ranks must give the same loss and gradient norm (rel 1e-5), the same full
gradients and the same weights after the AdamW step (abs 1e-5), the latter read from the
HF-format checkpoint that the sharded actor gathers tensor by tensor to rank 0.

lr=1e-4: AdamW's first step is lr * g / (|g| + eps), whose slope near |g| ~ eps is
~1 / (4 eps): summation noise of 1e-9 on such a gradient moves its weight by ~lr * 0.025
(1.8e-5 at lr=1e-3, measured with tp=2), while the gradients themselves agree to ~1e-9.
The gradients are the exact statement; the weights check the optimizer state is whole.

The 2-rank fsdp2 test also runs the colocated rollout engine beside the sharded actor: it
keeps its own gathered copy, and after the update `sync_weights(check=True)` shows the
engine samples from the updated weights (logprob parity).
"""

from __future__ import annotations

import pytest
import torch
from par_workers import ProbeActor, rollout_batch
from safetensors.torch import load_file

from baton.config import load_config
from baton.controller import ResourcePool, colocated_groups
from baton.models.load import load_model
from baton.models.make import make_tiny_checkpoint
from baton.trainers.ppo_config import PPOConfig
from baton.workers.rollout import RolloutConfig, RolloutWorker

TOL = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=1))


def actor_group(model_dir, backend="local", world=1, mesh=None, strategy="ddp", rollout=False, extra=()):
    """The actor role (and, with rollout=True, a colocated rollout role: a tuple)."""
    cfg = load_config(PPOConfig, overrides=[
        f"model.path={model_dir}", "data.prompts_per_step=4", "rollout.n=2", "actor.lr=1e-4",
        "actor.micro_batch_size=4", "rollout.max_new_tokens=6", "actor.grad_clip=1e9",
        f"actor.strategy={strategy}", *extra])
    pool = ResourcePool(world, backend=backend, mesh=mesh, threads_per_worker=1)
    roles = {"actor": (ProbeActor, (cfg.model, cfg.actor, cfg.algo),
                       dict(temperature=1.0, max_new_tokens=6, total_steps=2, seed=0))}
    if rollout:
        roles["rollout"] = (RolloutWorker, (RolloutConfig(n=2, max_new_tokens=4),),
                            dict(task="arithmetic", seed=0, probe_prompt="12+34="))
    groups = colocated_groups(pool, roles)
    return (groups["actor"], groups["rollout"]) if rollout else groups["actor"]


def one_update(model_dir, out, with_rollout=False, **kw):
    """(metrics, full grads, weights of the saved HF checkpoint) after one update; with
    a colocated rollout role, the engine's logprob parity after the sync too."""
    group, rollout = (actor_group(model_dir, rollout=True, **kw) if with_rollout
                      else (actor_group(model_dir, **kw), None))
    try:
        if rollout is not None:
            before = rollout.sync_weights(0, check=True)
        metrics = group.update(rollout_batch())
        grads = group.full_grads() if "actor.offload=true" not in kw.get("extra", ()) else None
        if rollout is not None:
            after = rollout.sync_weights(1, check=True)
            assert max(before + after) < 1e-4, (before, after)
        group.save_checkpoint(str(out), {"step": 1})
    finally:
        if rollout is not None:
            rollout.shutdown()
        group.shutdown()
    return metrics[0], grads, load_file(str(out / "model.safetensors"))


@pytest.fixture(scope="module")
def ddp_one(model_dir, tmp_path_factory):
    return one_update(model_dir, tmp_path_factory.mktemp("ddp") / "ckpt")


def assert_equal_update(ref, got):
    (m0, g0, w0), (m1, g1, w1) = ref, got
    assert m1["actor/loss"] == pytest.approx(m0["actor/loss"], rel=TOL)
    assert m1["actor/grad_norm"] == pytest.approx(m0["actor/grad_norm"], rel=TOL)
    assert g0.keys() == g1.keys() and w0.keys() == w1.keys()
    assert max((g0[k] - g1[k]).abs().max().item() for k in g0) < TOL
    worst = max((w0[k] - w1[k]).abs().max().item() for k in w0)
    assert worst < TOL, worst


def test_fsdp2_on_one_rank_is_ddp_and_resumes(model_dir, tmp_path, ddp_one):
    """fsdp2 on a 1-rank mesh (DTensor parameters, no peers): the same update, an HF
    checkpoint a plain load reads, and save -> load -> update equal to two updates."""
    got = one_update(model_dir, tmp_path / "a", strategy="fsdp2")
    assert_equal_update(ddp_one, got)
    plain = dict(load_model(tmp_path / "a").named_parameters())
    assert max((plain[k] - got[2][k]).abs().max().item() for k in got[2]) == 0

    straight = actor_group(model_dir, strategy="fsdp2")
    try:
        straight.update(rollout_batch())
        m_straight = straight.update(rollout_batch(seed=1))[0]
        w_straight = straight.full_weights()
    finally:
        straight.shutdown()
    resumed = actor_group(model_dir, strategy="fsdp2")
    try:
        assert resumed.load_checkpoint(str(tmp_path / "a"))[0] == {"step": 1}
        m_resumed = resumed.update(rollout_batch(seed=1))[0]
        w_resumed = resumed.full_weights()
    finally:
        resumed.shutdown()
    assert m_resumed["actor/loss"] == pytest.approx(m_straight["actor/loss"], rel=TOL)
    assert max((w_straight[k] - w_resumed[k]).abs().max().item() for k in w_straight) < TOL


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp2", marks=pytest.mark.slow)])
def test_activation_checkpointing_and_offload_change_no_number(model_dir, tmp_path, ddp_one, strategy):
    """Recomputing layers in backward (no shared prompt forward then) and freeing grads /
    moving the optimizer state between phases give the same update; a second update after
    an offload gives the same as without."""
    extra = ("actor.activation_checkpointing=true", "actor.offload=true")
    got = one_update(model_dir, tmp_path / "ac", strategy=strategy, extra=extra)
    assert got[1] is None  # offload freed the gradients after the update
    assert_equal_update(ddp_one, (got[0], ddp_one[1], got[2]))
    two = {}
    for name, ex in (("plain", ()), ("offload", extra)):
        group = actor_group(model_dir, strategy=strategy, extra=ex)
        try:
            group.update(rollout_batch())
            two[name] = (group.update(rollout_batch(seed=1))[0], group.full_weights())
        finally:
            group.shutdown()
    assert two["offload"][0]["actor/loss"] == pytest.approx(two["plain"][0]["actor/loss"], rel=TOL)
    assert max((two["plain"][1][k] - two["offload"][1][k]).abs().max().item() for k in two["plain"][1]) < TOL


@pytest.mark.ray  # the session's Ray instance (tests/conftest.py)
def test_fsdp2_on_two_ranks_equals_one_rank_ddp(model_dir, tmp_path, ddp_one):
    assert_equal_update(ddp_one, one_update(model_dir, tmp_path / "c", backend="ray", world=2,
                                            strategy="fsdp2", with_rollout=True))


@pytest.mark.ray
@pytest.mark.slow  # ~25 s here; the fsdp2 test above covers the same machinery by default
def test_tensor_parallel_two_ranks_equals_one_rank_ddp(model_dir, tmp_path, ddp_one):
    assert_equal_update(ddp_one, one_update(model_dir, tmp_path / "c", backend="ray", world=2,
                                            mesh={"tp": 2}))


@pytest.mark.ray
@pytest.mark.slow  # 4 processes on this machine's 2 cores
@pytest.mark.parametrize("strategy,mesh", [("fsdp2", {"fsdp": 2, "tp": 2}),  # 2-D FSDP x TP
                                           ("fsdp2", {"dp": 2, "fsdp": 2}),  # HSDP
                                           ("ddp", {"dp": 2, "tp": 2})])
def test_four_rank_meshes_equal_one_rank_ddp(model_dir, tmp_path, ddp_one, strategy, mesh):
    assert_equal_update(ddp_one, one_update(model_dir, tmp_path / "c", backend="ray", world=4,
                                            mesh=mesh, strategy=strategy))


def test_bad_strategy_and_mesh_are_config_errors(model_dir):
    with pytest.raises(ValueError, match="strategy"):
        load_config(PPOConfig, overrides=[f"model.path={model_dir}", "actor.strategy=zero3"])
    with pytest.raises(ValueError, match="placement.mesh"):
        load_config(PPOConfig, overrides=[f"model.path={model_dir}", "placement.backend=ray",
                                           "placement.world_size=4", "placement.mesh.tp=3"])


def test_tp_refuses_head_counts_it_cannot_split():
    from baton.models.parallel import apply_tp
    from baton.models.tiny import build_tiny_model

    class TwoRanks:  # the checks run before any communication: a mesh's size is enough
        def size(self):
            return 2

    model = build_tiny_model("0.75m", heads=3, kv_heads=3, hidden=96)  # 3 heads: not over tp=2
    with pytest.raises(ValueError, match="num_attention_heads"):
        apply_tp(model, TwoRanks())


def test_sharded_grad_norm_matches_torch():
    """clip_sharded_grad_norm_ on plain gradients equals torch's clip_grad_norm_."""
    from baton.models.parallel import clip_sharded_grad_norm_

    g = torch.Generator().manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(5, 3, generator=g)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn(p.shape, generator=g)
        q.grad = p.grad.clone()
    n_torch = torch.nn.utils.clip_grad_norm_(a, 0.5)
    n_ours = clip_sharded_grad_norm_(b, 0.5)
    assert n_ours.item() == pytest.approx(n_torch.item(), rel=1e-6)
    assert all(torch.allclose(p.grad, q.grad, atol=1e-7) for p, q in zip(a, b))


def test_sharded_reference_gives_the_same_logprobs_and_weights(model_dir):
    """ReferenceWorker with the actor's strategy (fsdp2 on a 1-rank mesh): the same ref
    logprobs, and get_weights / load_weights round-trip full tensors."""
    from baton import fields as F
    from baton.models.config import ModelConfig
    from baton.workers.reference import ReferenceWorker

    out = {}
    for strategy in ("ddp", "fsdp2"):
        pool = ResourcePool(1)
        ref = colocated_groups(pool, {"reference": (ReferenceWorker, (ModelConfig(path=model_dir),),
                                                    dict(temperature=1.0, micro_batch_size=4,
                                                         strategy=strategy))})["reference"]
        try:
            out[strategy] = ref.compute_ref_logprobs(rollout_batch()).get()[F.REF_LOGPROBS]
            weights = ref.get_weights()
            ref.load_weights({k: v * 0 for k, v in weights.items()})
            assert all(v.abs().max() == 0 for v in ref.get_weights().values())
            ref.load_weights(weights)
            assert (ref.compute_ref_logprobs(rollout_batch()).get()[F.REF_LOGPROBS] - out[strategy]).abs().max() == 0
        finally:
            ref.shutdown()
    assert (out["ddp"] - out["fsdp2"]).abs().max() < TOL


@pytest.mark.ray
@pytest.mark.slow  # a 2-rank pool and a server
def test_sharded_actor_broadcasts_into_a_server(model_dir):
    """fsdp2 on 2 ranks -> BroadcastSync into a baton server whose weights start elsewhere:
    the specs come from the DTensors' global shapes, tensors are gathered per bucket (several
    buckets here), and the server then samples with the trainer's weights."""
    from par_workers import BroadcastingActor

    from baton.models.tiny import build_tiny_model
    from baton.rollout.embedded.engine import EmbeddedEngine
    from baton.rollout.remote import RemoteEngine
    from baton.rollout.server import ServerThread, build_app
    from baton.sync import check_logprob_parity

    plain = load_model(model_dir)
    served = EmbeddedEngine(build_tiny_model("0.75m", seed=7).eval(), eos_token_ids=[2], pad_token_id=0)
    cfg = load_config(PPOConfig, overrides=[f"model.path={model_dir}", "data.prompts_per_step=4", "rollout.n=2",
                                             "actor.lr=1e-4", "actor.strategy=fsdp2"])
    pool = ResourcePool(2, backend="ray", threads_per_worker=1)
    actor = colocated_groups(pool, {"actor": (BroadcastingActor, (cfg.model, cfg.actor, cfg.algo),
                                              dict(temperature=1.0, max_new_tokens=6, total_steps=2,
                                                   seed=0))})["actor"]
    with ServerThread(build_app(served, None, "tiny")) as srv:
        try:
            actor.update(rollout_batch())
            actor.broadcast_to(srv.url, 1, 0.05)
            weights = actor.full_weights()
        finally:
            actor.shutdown()
        with torch.no_grad():
            for name, p in plain.named_parameters():
                p.copy_(weights[name])
        assert served.version == 1
        assert check_logprob_parity(RemoteEngine(srv.url), plain, [5, 9, 11, 4], 6) < 1e-5
