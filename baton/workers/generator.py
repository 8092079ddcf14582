"""The two ends of a disaggregated rollout: a generator on a pool of its own, and the actor's
weights served to it.

    GeneratorWorker   the rollout role apart from the actor (`placement.roles.rollout: gen`):
                      its own copy of the model (loaded from `model.path`), the same
                      `generate` / `evaluate` as the colocated `RolloutWorker`, and
                      `load_weights(weights, version)` instead of reading the actor in place
    WeightsWorker     colocated with the actor (built right after it on the actor's pool):
                      `full_weights()` returns the actor's parameters as one {name: tensor}
                      dict on rank 0 with their digests (checked by the generator), and `probe_logprobs` scores the parity probe with the
                      trainer's module

How weights travel (`rollout.weight_sync`: auto = object_store; the driver-side halves are
`baton.sync.object_store.ObjectStoreSync` and `baton.sync.broadcast.GeneratorBroadcast`):
  object_store (the default)  the driver passes the future of `weights.full_weights()`
        straight into `generator.load_weights(...)`; on Ray the tensors go actor -> object
        store -> generator, never through the driver, and the actor returns as soon as its
        result is stored: it never waits for the generator to finish what it is doing.
  broadcast  a torch.distributed group of actor rank 0 and the generator ranks (gloo on
        CPU, NCCL on GPU; `baton.sync.group`, the transport `baton serve` speaks):
        `weights.send_weights()` and `generator.receive_weights(...)` meet in the
        collective, so the actor waits until the generator has finished the steps queued
        before the push (no loss at max_staleness 1: the trainer needs those rows next).
        Loopback address: one machine.

Consumes / produces: as `RolloutWorker` (rows with behaviour logprobs and the policy
version that sampled them). Waits for nothing: calls run in the order the driver submitted
them, which is what makes the staleness schedule of `baton.sources.ahead` exact.
"""

from __future__ import annotations

import socket
import warnings
from typing import Any, Iterator

import torch

from baton.controller import Dispatch, Execute, Worker, register
from baton.envs import get_task
from baton.models.config import ModelConfig
from baton.models.load import load_model, load_tokenizer
from baton.models.precision import compute_dtype, resolve_bf16
from baton.models.lora import is_peft, merged_weights
from baton.protocol import SamplingParams
from baton.rollout.engines import build_engine
from baton.sync import WeightReceiver
from baton.sync.digest import staged, tensor_digest
from baton.sync.group import WeightUpdateGroup, dtype_name, gather_buckets, plan_buckets, send_buckets, send_digests
from baton.workers.policy import Policy
from baton.workers.rollout import RolloutConfig, RolloutWorker

PROBE_TOKENS = 4  # greedy tokens compared by the weight-sync parity check
BUCKET_BYTES = 64 * 2**20  # broadcast: tensors packed into flat buffers of about this size
WEIGHT_GROUP_TIMEOUT_S = 600.0  # a broadcast waits this long for a peer (a dead one: see the source)


def to_wire(t: torch.Tensor) -> Any:
    """A CPU tensor as a numpy array (zero-copy); bf16, which numpy lacks, as its int16 bits
    with the dtype beside them."""
    t = t.cpu()
    return (t.view(torch.int16).numpy(), "bfloat16") if t.dtype == torch.bfloat16 else t.numpy()


def from_wire(x: Any) -> torch.Tensor:
    if isinstance(x, tuple):
        return torch.from_numpy(x[0]).view(torch.bfloat16)
    return torch.from_numpy(x) if not isinstance(x, torch.Tensor) else x


def wire_weights(named: Iterator[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """What `WeightsWorker.full_weights` hands the object store: {"tensors": {name: wire
    array}, "digests": {name: digest}} (copied to the CPU first: the caller may hold them while
    the actor's next update changes its parameters in place)."""
    tensors, sent = {}, {}
    for name, t in named:
        t = t.detach().to("cpu", copy=True)
        sent[name], tensors[name] = tensor_digest(t), to_wire(t)
    return {"tensors": tensors, "digests": sent}


def weights_from_wire(payload: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of `wire_weights`' payload, every one checked against its
    digest before any is returned (`WeightDigestError` naming the first that differs or is
    missing): the generator installs all of them or none."""
    with warnings.catch_warnings():  # numpy buffers of the object store are read-only: only read
        warnings.simplefilter("ignore", UserWarning)
        return staged(((n, from_wire(x)) for n, x in payload["tensors"].items()), payload["digests"])


class GeneratorWorker(RolloutWorker):
    """`GeneratorWorker(rollout, model=, task=, seed=, probe_prompt=, bf16=)`: a rollout
    engine with its own weights. Sampling is seeded per (seed, step, dp rank) exactly like the
    colocated role, and the engine reads its module the same way (no fused copy), so with the
    same weights it samples exactly the same rows. `bf16`: the actor's `actor.bf16` (None: on
    CUDA yes, on the CPU no): the copy is held in bf16 where the trainer computes in bf16."""

    def __init__(self, rollout: RolloutConfig, *, model: ModelConfig, task: str, seed: int,
                 probe_prompt: str, bf16: bool | None = None, verifier_timeout_s: float = 5.0):
        Worker.__init__(self)  # not RolloutWorker's: there is no colocated actor to read
        self.cfg, self.task, self.seed = rollout, get_task(task), seed
        self.verifier_timeout_s = verifier_timeout_s  # evaluation's verifier calls: reward.timeout_s
        dtype = compute_dtype(resolve_bf16(bf16, self.device)) or model.torch_dtype
        module = load_model(model.path, dtype=dtype, device=self.device)
        self.tokenizer = load_tokenizer(model.path)
        # RolloutWorker.generate may consult `policy` (a plain module: read in place)
        self.policy = Policy(module, self.tokenizer)
        self.engine = build_engine(rollout.engine, module, self.tokenizer, model_path=model.path, fuse_weights=False,
                                   **rollout.engine_budget())
        self.own_weights = False  # its weights are the engine's own module, kept between steps
        self.probe_ids = self.tokenizer(probe_prompt).input_ids

    def _rest(self, generated: bool = True) -> None:
        """Never asleep: no trainer shares this device (the KV cache is released after every
        call by the engine itself), so emptying the CUDA cache would only cost the next call."""

    def sync_weights(self, version: int, check: bool = False) -> None:  # not driver-callable here
        raise RuntimeError("a generator on its own pool gets its weights through load_weights")

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_weights(self, weights: Any, version: int) -> int:
        """Copy the trainer's weights (`WeightsWorker.full_weights`: a dict, or the per-rank
        list whose rank-0 entry is the dict) into the engine; its rows are then `version`."""
        if isinstance(weights, list):
            weights = next(w for w in weights if w is not None)
        self.engine.update_weights(weights_from_wire(weights), version)  # checked against the digests first
        return version

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def join_weight_group(self, master_address: str, master_port: int, world_size: int,
                          backend: str) -> None:
        """Join the actor's broadcast group as rank 1 + this rank (blocks until all joined)."""
        self.receiver = WeightReceiver(self.engine)
        self.receiver.init_weights_update_group(master_address, master_port, 1 + self.rank, world_size,
                                                backend=backend, timeout_s=WEIGHT_GROUP_TIMEOUT_S)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def receive_weights(self, specs: tuple[list, list, list], version: int) -> int:
        """Receive the broadcast of `WeightsWorker.send_weights` (names, dtypes, shapes)."""
        names, dtypes, shapes = specs
        self.receiver.receive_checked(names, dtypes, shapes, version, bucket_bytes=BUCKET_BYTES)  # digests follow
        return version

    @register(dispatch=Dispatch.ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def probe(self) -> tuple[list[int], list[int], list[float]]:
        """The parity probe: (prompt ids, greedy token ids, the engine's logprobs of them)."""
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=PROBE_TOKENS, ignore_eos=True)
        comp = self.engine.generate([list(self.probe_ids)], params)[0]
        return list(self.probe_ids), list(comp.token_ids), list(comp.logprobs)


class WeightsWorker(Worker):
    """`WeightsWorker()`, colocated with the actor (its sibling "actor" is read, never
    changed): the actor's weights for a generator on another pool."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = self.sibling("actor").policy

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)  # returns a future
    def full_weights(self) -> dict[str, Any] | None:
        """`wire_weights`: {"tensors": {name: weights}, "digests": {name: digest}} on rank 0
        (None on the other ranks, which only take part in gathering sharded tensors), as numpy
        arrays (`to_wire`): Ray moves those out of band, 5-8x faster than torch tensors
        (measured: 3.3 MB, ray.put 5 ms vs 40 ms); the generator checks the digests before it
        installs (`weights_from_wire`)."""
        out = wire_weights(self._named_weights())  # copied straight to the CPU, with the digests
        return out if self.rank == 0 else None

    def _named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's weights under the plain model's names; a LoRA actor's merged (base +
        adapter): the generator holds a plain model (`baton.models.lora.merged_weights`)."""
        if is_peft(self.policy.module):
            return merged_weights(self.policy.module)
        return self.policy.named_weights()

    def _params(self) -> tuple[list[torch.Tensor], list[tuple[str, str, list[int]]]]:
        """The actor's parameters as they are (DTensors when sharded: nothing gathered) and
        their specs (name, dtype, global shape), in module order."""
        module = self.policy.module
        named = list(merged_weights(module) if is_peft(module) else module.named_parameters())
        return [t for _, t in named], [(n, dtype_name(t.dtype), list(t.shape)) for n, t in named]

    @register(dispatch=Dispatch.ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def open_weight_group(self) -> tuple[str, int, tuple[list, list, list]]:
        """Bind the broadcast group's port (rank 0): (address, port, (names, dtypes, shapes)).
        The specs come from the parameters themselves (a sharded DTensor's shape is its global
        shape): rank 0 alone gathers nothing, which would wait forever for the other ranks."""
        self._listen = socket.create_server(("127.0.0.1", 0), backlog=128)
        names, dtypes, shapes = zip(*self._params()[1])
        return "127.0.0.1", self._listen.getsockname()[1], (list(names), list(dtypes), list(shapes))

    @register(dispatch=Dispatch.ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def join_weight_group(self, world_size: int, backend: str) -> None:
        """Host the group as rank 0 (blocks until every generator rank has joined)."""
        host, port = self._listen.getsockname()[:2]
        self.group = WeightUpdateGroup(host, port, 0, world_size, backend=backend,
                                       timeout_s=WEIGHT_GROUP_TIMEOUT_S, listen_socket=self._listen)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    @torch.no_grad()
    def send_weights(self) -> None:
        """Broadcast the current weights bucket by bucket: sharded tensors are gathered one
        bucket at a time (every rank takes part, rank 0 sends), never the whole model."""
        tensors, specs = self._params()
        plan = plan_buckets(specs, BUCKET_BYTES)
        if self.rank == 0:
            sent: dict[int, str] = {}
            send_buckets(self.group, tensors, plan, digests=sent)
            send_digests(self.group, [sent[i] for i in range(len(tensors))])  # the generator checks, then installs
        else:
            gather_buckets(tensors, plan)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    @torch.no_grad()
    def probe_logprobs(self, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
        """The trainer's logprobs (temperature 1) of `token_ids` after `prompt_ids`: one
        forward of the actor's module (every rank runs it: sharded modules need them all)."""
        module = self.policy.module
        seq = torch.tensor([prompt_ids + token_ids], device=self.device)  # [1, P + R]
        was_training = module.training
        module.eval()
        logits = module(input_ids=seq).logits.float()  # [1, P + R, V]
        module.train(was_training)
        p, r = len(prompt_ids), len(token_ids)
        logp = torch.log_softmax(logits[0, p - 1: p - 1 + r], dim=-1)  # [R, V]
        return logp.gather(-1, seq[0, p:, None]).squeeze(-1).tolist()  # [R]
