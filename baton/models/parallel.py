"""Training strategies on a worker's device mesh: DDP, FSDP2, tensor parallelism, FSDP x TP.

A trainable role wraps its module once and then only calls the returned `Parallel`:

    par = wrap(model, mesh, "fsdp2")          # mesh: the worker's ("dp", "fsdp", "tp") mesh
    optim = build_optimizer(par.module, ...)  # after wrapping: sharded parameters are DTensors
    n = par.all_reduce(counts)                # sums over the *data* ranks (tp peers share data)
    par.arm_grad_sync(); loss.backward()      # ddp: buckets all-reduced while the backward runs
    par.sync_grads()                          # waits for them (unarmed: one flat all-reduce); fsdp2: done in backward
    norm = par.clip_grad_norm_(1.0)           # correct for DTensor (sharded) gradients
    for name, full in par.full_state_dict_iter(): ...   # full tensors one at a time (every rank calls)

Strategies (`strategy` x the mesh's sizes, taken from `placement.mesh`):
  ddp    every data rank holds the whole module; gradients summed over the data ranks
         (the losses carry global normalisers, so SUM, not mean): armed before a step's
         last backward, in 2 MiB buckets launched as the backward finishes them (DDP's
         reducer, by hand: `_OverlappedSync`); else (and with tp) one flat all-reduce.
  fsdp2  `fully_shard` on every decoder layer, then on the root (embeddings, final norm,
         tied head). Shards over the mesh's `fsdp` dim; when `placement.mesh` leaves fsdp
         at 1, over the `dp` dim (plain FSDP over every data rank); both > 1 is HSDP
         (replicate over dp, shard over fsdp). Reductions are sums (divide factor 1).
  tp>1   (either strategy) DTensor `parallelize_module` with the Llama / Qwen2 plan before
         any sharding: q/k/v/gate/up column-wise, o/down row-wise; embeddings, norms and
         the head stay replicated. With fsdp2 this is the 2-D FSDP x TP layout.
Data is split by the data-parallel coordinate (dp, fsdp) only (the controller's DP_COMPUTE);
tp peers get the same rows and compute the same loss, so every reduction of counts and
metrics runs over the data group, never the whole world.

`sharded` says whether parameters are DTensors: then nothing outside may read them as
plain tensors (a colocated engine keeps a gathered copy, see `workers/rollout.py`), and
checkpoints go through `full_state_dict_iter` / `load_full_state_dict` and the full
(FQN-keyed) optimizer state of `torch.distributed.checkpoint.state_dict`.

Activation checkpointing recomputes each decoder layer in backward (HF's non-reentrant
gradient checkpointing). The shared-prompt forward of `workers/sequences.py` appends to a
KV cache inside the layer, which a recompute would append twice, so with checkpointing
`share_prompts` is False: each row runs its own full forward (more compute, less memory:
that is the trade being asked for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from baton.models.host_stash import HostStash

STRATEGIES = ("ddp", "fsdp2")
Strategy = Literal["ddp", "fsdp2"]

# The Llama / Qwen2 tensor-parallel plan, per decoder layer (Megatron-style: a column-wise
# projection feeds a row-wise one, so each block needs one all-reduce forward, one backward).
TP_PLAN = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
           "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
           "mlp.down_proj": "rowwise"}
TP_FAMILIES = ("llama", "qwen2")


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM / value model (`model.layers`)."""
    base = getattr(module, "base_model", module)
    base = getattr(base, "model", base) if not hasattr(base, "layers") else base
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(module).__name__}: no decoder layers found (expected .model.layers)")
    return list(layers)


def _dim(mesh: DeviceMesh, name: str) -> int:
    return mesh.size(mesh.mesh_dim_names.index(name))


@dataclass
class Parallel:
    """A role's module on its mesh, and the collectives that are correct for its layout."""

    module: nn.Module
    strategy: str
    mesh: DeviceMesh | None
    data_group: Any  # process group of the data ranks (None: the default group)
    data_size: int
    tp_size: int
    share_prompts: bool = True  # False under activation checkpointing (see module docstring)
    _overlap: "_OverlappedSync | None" = None  # ddp over plain tensors: built on first arm_grad_sync

    @property
    def sharded(self) -> bool:
        """True when parameters are DTensors (fsdp2, or tp > 1)."""
        return self.strategy == "fsdp2" or self.tp_size > 1

    # --- reductions ----------------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """SUM over the data ranks, in place (each tp peer holds the same value already)."""
        if self.data_size > 1:
            dist.all_reduce(t, group=self.data_group)
        return t

    def sync_grads(self, extra: torch.Tensor | None = None) -> torch.Tensor | None:
        """Sum gradients over the data ranks. ddp: one all-reduce of a flat buffer (the
        DTensor grads of a tp-sharded module by their local shards). fsdp2: FSDP has already
        reduce-scattered (and, for HSDP, all-reduced) them in backward: nothing to do.

        extra: a small 1-D tensor summed over the data ranks in the same all-reduce (appended
        to the buffer in the gradients' dtype; a caller passes values that survive the cast:
        0 / NaN flags, counts). Returns its sum, or None when no all-reduce ran (fsdp2, one
        rank, no gradients): the caller reduces it itself if it must."""
        if self.strategy == "fsdp2" or self.data_size == 1:
            return None
        if self._overlap is not None and self._overlap.armed:
            return self._overlap.finish()
        grads = [_local(p.grad) for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return None
        tail = [] if extra is None else [extra.to(device=grads[0].device, dtype=grads[0].dtype)]
        flat = _flatten_dense_tensors(grads + tail)
        dist.all_reduce(flat, group=self.data_group)  # SUM: losses are divided by global counts
        n_grad = flat.numel() - sum(t.numel() for t in tail)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat[:n_grad], grads)):
            g.copy_(synced)
        return flat[n_grad:].to(extra.dtype) if extra is not None else None

    def arm_grad_sync(self, extra: torch.Tensor | None = None) -> None:
        """Call before the last backward of an optimizer step: gradients are then summed in
        buckets launched (async) as the backward finishes them, so the all-reduce overlaps
        the rest of the backward; `sync_grads()` waits for them (and returns `extra`'s sum,
        carried by the last bucket). ddp over plain tensors only (tp / fsdp2 / one rank:
        nothing to arm; `sync_grads` does what it always did)."""
        if self.strategy != "ddp" or self.data_size == 1 or self.tp_size > 1:
            return
        if self._overlap is None:
            self._overlap = _OverlappedSync(self.module, self.data_group)
        self._overlap.arm(extra)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Global L2 norm of all gradients (before clipping); scales them to `max_norm`.

        Unsharded modules use torch's own `clip_grad_norm_` (bit-for-bit what the trainer
        always did). Sharded: each gradient's local sum of squares, summed across the mesh
        dims it is sharded on (replicated dims hold copies and are not summed)."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        if not self.sharded:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        return clip_sharded_grad_norm_(params, max_norm)

    # --- full tensors ------------------------------------------------------------------
    def full_state_dict_iter(self, device: str | torch.device | None = None
                             ) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) for every parameter, one at a time, in module order.

        Sharded parameters are all-gathered one tensor at a time (a collective: every rank
        must consume the iterator in step), so at most one full tensor beyond the shards is
        alive per step of the iteration; `device` moves each (e.g. "cpu" for a checkpoint).
        Unsharded parameters are yielded as they are (no copy unless `device` differs)."""
        yield from full_state_dict_iter(self.module, device)

    def load_full_state_dict(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy full tensors (every rank holds all of them) into the parameters in place,
        each rank keeping its own shard (no communication)."""
        load_full_state_dict(self.module, named)

    # --- optimizer state -----------------------------------------------------------------
    def optim_state_dict(self, optim: torch.optim.Optimizer) -> dict[str, Any]:
        """What a checkpoint stores: `optim.state_dict()` unsharded; sharded, the full
        FQN-keyed state gathered to rank 0's CPU (other ranks get {}), loadable on any mesh.
        A collective when sharded: every rank calls it."""
        if not self.sharded:
            return optim.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        return get_optimizer_state_dict(self.module, optim,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_optim_state_dict(self, optim: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        if not self.sharded:
            optim.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        set_optimizer_state_dict(self.module, optim, state, options=StateDictOptions(full_state_dict=True))


GRAD_BUCKET_BYTES = 1 << 21  # 2 MiB per all-reduce bucket (the demo's 3.3 MB of gradients: 2 buckets)


class _OverlappedSync:
    """Gradient buckets all-reduced while the backward runs (DDP's reducer, by hand).

    Buckets: the parameters in reverse order (the backward finishes the last layers first),
    cut at GRAD_BUCKET_BYTES and wherever dtype or device changes. Each bucket owns one flat
    buffer and, while armed, every parameter's `.grad` is a view into it (DDP's
    `gradient_as_bucket_view`): the backward accumulates straight into the buffer and the
    all-reduce sums it in place, so no gradient is copied into a bucket or back out of it
    (measured side by side on two gloo ranks, a 5M model's forward + backward of 32 x 39
    tokens: 2-3% less CPU a rank than copying). A post-accumulate-grad hook counts each
    bucket's gradients; bucket i is launched (async all-reduce of its buffer) once it is
    complete and buckets 0..i-1 are launched: the same order on every rank, whatever order
    each rank's backward produced them in. `finish` launches what is left and waits. A
    parameter that got no gradient in the step keeps `.grad = None` (the optimizer skips it,
    as with one rank; one model and one loss give every rank the same such parameters); it
    is summed as zeros. The sums are those of the same values a flat buffer would hold: SUM
    over ranks is elementwise."""

    def __init__(self, module: nn.Module, group: Any):
        self.group = group
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets: list[list[nn.Parameter]] = []
        size = GRAD_BUCKET_BYTES
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            cut = self.buckets and self.buckets[-1] and (p.dtype, p.device) != (self.buckets[-1][0].dtype,
                                                                                 self.buckets[-1][0].device)
            if (size + nbytes > GRAD_BUCKET_BYTES or cut) and (not self.buckets or self.buckets[-1]):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self.where = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self.flats: list[torch.Tensor] = []
        self.armed = False
        for p in params:
            p.register_post_accumulate_grad_hook(self._ready)

    def arm(self, extra: torch.Tensor | None) -> None:
        if extra is not None and extra.numel() > 1:
            raise ValueError(f"the gradient sync carries one extra element, got {extra.numel()}")
        self.armed, self.extra = True, extra
        self.count = [0] * len(self.buckets)
        self.next = 0
        self.works: list[Any] = []
        self.got: set[int] = set()  # parameters the armed backward accumulated into
        self.had: set[int] = set()  # parameters with a gradient from earlier micro-batches
        # one buffer per bucket (+1 element in the last: `extra`, summed alongside), new each
        # step and held only by the gradients after `finish`: freed with them (`zero_grad`,
        # offload), as DDP's would not be
        self.flats = [torch.zeros(sum(p.numel() for p in b) + (i == len(self.buckets) - 1),
                                  dtype=b[0].dtype, device=b[0].device) for i, b in enumerate(self.buckets)]
        with torch.no_grad():
            for flat, bucket in zip(self.flats, self.buckets):
                at = 0
                for p in bucket:
                    view = flat[at:at + p.numel()].view_as(p)
                    if p.grad is not None:  # earlier micro-batches of this step: carry their sum
                        view.copy_(p.grad)
                        self.had.add(id(p))
                    p.grad = view
                    at += p.numel()

    def _ready(self, p: nn.Parameter) -> None:
        if not self.armed:
            return
        self.got.add(id(p))
        i = self.where[id(p)]
        self.count[i] += 1
        while self.next < len(self.buckets) and self.count[self.next] == len(self.buckets[self.next]):
            self._launch(self.next)

    def _launch(self, i: int) -> None:
        flat = self.flats[i]
        if i == len(self.buckets) - 1:
            flat[-1] = 0.0 if self.extra is None else self.extra.reshape(())
        self.works.append(dist.all_reduce(flat, group=self.group, async_op=True))
        self.next = i + 1

    def finish(self) -> torch.Tensor | None:
        while self.next < len(self.buckets):
            self._launch(self.next)
        self.armed = False
        for work in self.works:
            work.wait()
        self.works = []
        for bucket in self.buckets:
            for p in bucket:
                if id(p) not in self.got and id(p) not in self.had:
                    p.grad = None  # no gradient in this step: as without the sync (summed as zeros)
        tail, self.flats = self.flats[-1][-1:], []
        return None if self.extra is None else tail.to(self.extra.dtype)


@torch.no_grad()
def move_optimizer_state(optim: torch.optim.Optimizer, device: str | torch.device,
                         stash: HostStash | None = None) -> int:
    """Move every optimizer state tensor (Adam's moments; not the step counters, which
    fused AdamW keeps beside the parameters) to `device`; returns the bytes moved. Between
    phases: the rollout phase need not hold the optimizer on the accelerator. To the CPU:
    one copy each into `stash`'s buffers (pinned where CUDA is; keep the stash from one
    offload to the next and they are allocated once); back: from them, asynchronously.
    Returns after the copies are done (a device sync when any moved on CUDA)."""
    device, moved = torch.device(device), 0
    stash = HostStash() if stash is None else stash
    for p, state in optim.state.items():
        for k, t in state.items():
            if isinstance(t, torch.Tensor) and t.dim() > 0 and t.device != device:
                state[k] = stash.to_host((id(p), k), t) if device.type == "cpu" else t.to(device, non_blocking=True)
                moved += _local(t).numel() * t.element_size()
    if moved and torch.cuda.is_available():
        torch.cuda.synchronize()  # non_blocking both ways: the host may read the buffers next
    return moved


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def clip_sharded_grad_norm_(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """`clip_grad_norm_` for a mix of DTensor and plain gradients (see Parallel)."""
    # key: (mesh, dims to sum over) -> local sums of squares; plain tensors: key None
    buckets: dict[Any, list[torch.Tensor]] = {}
    meshes: dict[int, DeviceMesh] = {}
    for p in params:
        g = p.grad
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):
                raise RuntimeError("gradient with a Partial placement: reduce it before clipping")
            # every non-replicated dim holds disjoint pieces (Shard, and FSDP-over-TP's
            # _StridedShard, which is not a Shard subclass)
            dims = tuple(i for i, pl in enumerate(g.placements) if not pl.is_replicate())
            meshes[id(g.device_mesh)] = g.device_mesh
            key = (id(g.device_mesh), dims)
            local = g.to_local()
        else:
            key, local = None, g
        buckets.setdefault(key, []).append(local.float().pow(2).sum())
    total = torch.zeros((), dtype=torch.float32)
    for key, sums in buckets.items():
        s = torch.stack(sums).sum()
        if key is not None:
            mesh, dims = meshes[key[0]], key[1]
            for d in dims:  # summing over each sharded dim in turn sums over their product
                if mesh.size(d) > 1:
                    dist.all_reduce(s, group=mesh.get_group(d))
        total = total + s.to(total.device)
    norm = total.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        _local(p.grad).mul_(coef.to(_local(p.grad).device))
    return norm


def full_state_dict_iter(module: nn.Module, device: str | torch.device | None = None
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """See `Parallel.full_state_dict_iter` (usable on any module, wrapped or not)."""
    for name, p in module.named_parameters():
        t = p.detach()
        if isinstance(t, DTensor):
            t = t.full_tensor()
        if device is not None:
            t = t.to(device)
        yield name, t


@torch.no_grad()
def load_full_state_dict(module: nn.Module, named: Iterable[tuple[str, torch.Tensor]]) -> None:
    """See `Parallel.load_full_state_dict`."""
    params = dict(module.named_parameters())
    for name, full in named:
        p = params.get(name)
        if p is None:
            continue  # e.g. a tied alias (lm_head.weight) saved beside its source
        if isinstance(p, DTensor):
            shard = distribute_tensor(full.to(device=p.device, dtype=p.dtype), p.device_mesh, p.placements,
                                      src_data_rank=None)  # every rank has `full`: slice, no comm
            p.to_local().copy_(shard.to_local())
        else:
            p.copy_(full)


def _model_type(module: nn.Module) -> str | None:
    return getattr(getattr(module, "config", None), "model_type", None)


def apply_tp(module: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Tensor-parallel decoder layers (TP_PLAN) on the 1-D `tp_mesh`; checks head counts."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    cfg = module.config
    tp = tp_mesh.size()
    if _model_type(module) not in TP_FAMILIES:
        raise ValueError(f"tensor parallelism has a plan for {TP_FAMILIES}, not {_model_type(module)!r}")
    for what, n in (("num_attention_heads", cfg.num_attention_heads),
                    ("num_key_value_heads", cfg.num_key_value_heads),
                    ("intermediate_size", cfg.intermediate_size)):
        if n % tp:
            raise ValueError(f"tp={tp} must divide {what}={n}")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {name: styles[kind]() for name, kind in TP_PLAN.items()}
    for layer in decoder_layers(module):
        parallelize_module(layer, tp_mesh, plan)


def wrap(module: nn.Module, mesh: DeviceMesh | None, strategy: str = "ddp", *,
         mixed_precision: bool = False, activation_checkpointing: bool = False,
         cpu_offload: bool = False) -> Parallel:
    """Apply `strategy` (and tp from the mesh) to `module` in place; returns its `Parallel`.

    mesh: the worker's 3-D ("dp", "fsdp", "tp") mesh (None: one process, no collectives).
    mixed_precision: fsdp2 on CUDA only: bf16 parameters in compute, fp32 reductions (on
    CPU the role's bf16 autocast is the only mixed precision). cpu_offload: fsdp2 on CUDA:
    parameters, gradients and optimizer state live on the CPU (FSDP2's CPUOffloadPolicy);
    phase offload of a whole role is `offload_to_cpu` / `load_to_device`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {STRATEGIES}")
    if activation_checkpointing:
        if hasattr(module, "activation_checkpointing_enable"):  # transformers >= 5.x's name
            module.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mesh is None:  # no process group: nothing to shard over
        return Parallel(module, "ddp", None, None, 1, 1, share_prompts=not activation_checkpointing)
    dp, fsdp, tp = (_dim(mesh, d) for d in ("dp", "fsdp", "tp"))
    data_group = None  # default group = the world, right when there is no tp dim
    if tp > 1:
        apply_tp(module, mesh["tp"])
        data_group = mesh["dp", "fsdp"]._flatten("dp_fsdp").get_group() if dp * fsdp > 1 else None
    if strategy == "fsdp2":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        if dp > 1 and fsdp > 1:
            shard_mesh = mesh["dp", "fsdp"]  # HSDP: replicate over dp, shard over fsdp
        else:
            shard_mesh = mesh["fsdp"] if fsdp > 1 or dp == 1 else mesh["dp"]
        cuda = mesh.device_type == "cuda"
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if mixed_precision and cuda else MixedPrecisionPolicy())
        offload = CPUOffloadPolicy() if cpu_offload and cuda else OffloadPolicy()
        for layer in decoder_layers(module):
            fully_shard(layer, mesh=shard_mesh, mp_policy=mp, offload_policy=offload)
        # the root reshards after forward too (FSDP's default keeps it gathered until the
        # backward): a forward-only call (a parity probe, logprobs) must not leave unsharded
        # parameters registered where the optimizer and the checkpoint expect the shards
        fully_shard(module, mesh=shard_mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=True)
        for m in module.modules():  # losses carry global normalisers: reduce by SUM
            if hasattr(m, "set_gradient_divide_factor"):
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return Parallel(module, strategy, mesh, data_group, dp * fsdp, tp,
                    share_prompts=not activation_checkpointing)
