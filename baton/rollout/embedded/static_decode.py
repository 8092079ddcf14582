"""Static decode: the fast runner's decode step over fixed-shape, fixed-address buffers, so
that on a GPU it runs as one CUDA graph replay per token instead of ~20 launches per layer,
and each graph is captured once and replayed across calls and requests.

`StaticDecoder` sits between the engine's decode loop and a `LlamaRunner` after its prefill,
with the runner's interface (`decode(tokens)`, `select(keep)`):

  * buckets, the same for every call: rows in the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24, ...
    (powers of two and 1.5x them: a batch is padded by < 50%), cache length (prompt +
    max_new) likewise rounded up; a bucket's rows are a prefix of its `Arena`'s buffers;
  * an `Arena` (one per cache-length bucket and generation in flight): the KV cache, key
    bias, positions, token buffer, slot and every RoPE table the step reads (its own: the
    runner's are dropped by `release` and replaced by the next `start`) at fixed addresses,
    kept by the engine's `DecodeGraphs` across `generate` calls and `baton serve`'s requests
    (tests/graph_replay.py checks each replay on the CPU). A group's
    prefilled cache is copied into it (padded with copies of its first row); dropping
    finished rows only changes the row map `phys` until the logical rows fit a smaller
    bucket, then the live rows are gathered to the front of the same buffers;
  * one step function (a CUDA graph on a GPU) per (arena, bucket, length, sampling, weights):
    made the first time a batch enters that bucket and kept. Attention reads the filled cache
    slots rounded up to a length bucket, not the whole cache (a long generation's average
    KV read about halves). The weights are keyed by their addresses
    (`pack()` may build new fused copies, a sleep mode moves them): a change drops the
    arena's steps, so a graph never reads freed memory. `DecodeGraphs.captures` counts the
    steps made (on a CPU the decisions: the step runs eagerly there);
  * `engine.sleep()` drops the arenas and their graphs (the memory goes to the trainer).

The step (`LlamaRunner.decode_step` with a device-tensor slot) attends over all cache slots, the
unfilled ones masked (and zeroed here, so no 0 * NaN from memory an earlier call left): fixed
shapes, no host value. It runs in one of two ways (STEPS):
  "fixed"   eagerly (a CPU; on a GPU for comparison);
  "graph"   captured as a CUDA graph per bucket (`baton.rollout.embedded.cuda_graphs`, the only part
            not run on a CPU; on a CPU "graph" runs as "fixed").
Sampling (`sampling=`, no grammar) runs inside the step, on every bucket row, with the draws
taken outside on the logical rows and put in their bucket rows (`baton.rollout.embedded.sampling.draw`):
a seed draws the same numbers as the runner's own decode does, and each row's sampling is its
own, so the tokens are the same. fp32 on a CPU gives the default path's tokens; logprobs differ
by rounding only (measured <= 5e-6): SDPA sums over the masked slots too, and a matmul's
kernel (so its rounding) depends on the batch's row count, which padding to a bucket
changes (tests/rollout/test_static_decode.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from baton.rollout.embedded.cuda_graphs import GraphedStep
from baton.protocol import SamplingParams
from baton.rollout.embedded.sampling import needs_draw, sample_with

STEPS = ("fixed", "graph")
GRAPH_DEVICES = ("cuda",)  # device types whose "graph" step is captured (elsewhere it runs as "fixed")
MIN_LENGTH = 64  # the smallest cache-length bucket


def ladder_up(k: int, floor: int = 1) -> int:
    """The smallest of floor * (1, 2, 3, 4, 6, 8, 12, 16, ...) (powers of two and 1.5x them)
    that is >= k."""
    p = floor
    while True:
        if p >= k:
            return p
        if p * 3 // 2 >= k and p >= 2 * floor:
            return p * 3 // 2
        p *= 2


def bucket_for(k: int) -> int:
    """The row bucket that holds k rows."""
    return ladder_up(k)


def bucket_sizes(rows: int) -> list[int]:
    """The row buckets a batch of `rows` rows can pass through as rows finish, descending."""
    sizes = {bucket_for(k) for k in range(1, rows + 1)}
    return sorted(sizes, reverse=True)


def length_bucket(length: int) -> int:
    """The cache length (slots) an arena for `length` slots gets."""
    return ladder_up(length, MIN_LENGTH)


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for x in obj for t in _tensors(x)]
    return []


def weights_key(runner) -> tuple:
    """The addresses (and layouts) of every weight the step reads: a graph replays them."""
    ts = _tensors([runner.layers, runner.embed, runner.norm_w, runner.lm_head])
    return tuple((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for t in ts)


class Arena:
    """A group's decode state at fixed addresses: `capacity` rows x `length` cache slots."""

    def __init__(self, runner, capacity: int, length: int, dtype: torch.dtype, device: torch.device):
        self.capacity, self.length, self.dtype, self.device = capacity, length, dtype, device
        shape = (capacity, runner.n_kv, length, runner.head_dim)
        self.cache = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                      for _ in runner.layers]
        self.key_bias = torch.zeros(capacity, 1, 1, length, dtype=dtype, device=device)
        self.next_pos = torch.zeros(capacity, dtype=torch.long, device=device)
        self.tokens = torch.zeros(capacity, dtype=torch.long, device=device)
        self.u = torch.zeros(capacity, 1, dtype=torch.float32, device=device)  # a fused sampler's draws
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.slots = torch.arange(length, device=device)
        # RoPE over the arena's slots: every table its steps read is the arena's own (the
        # runner's are dropped by `release` and replaced by the next `start`)
        self.rope = runner.rope_tables(length, dtype, device)
        self.steps: dict[tuple, Callable] = {}  # (bucket rows, sampling) -> its step
        self.weights: tuple | None = None  # weights_key of the steps held

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors([self.cache, self.key_bias]))

    def load(self, runner, rows: int, size: int) -> None:
        """Copy the runner's prefilled group (rows rows, cache [rows, Hk, S, D], next slot
        runner.slot) into the first `size` rows (padded with copies of row 0), then point the
        runner at the arena's buffers."""
        P = runner.slot
        index = torch.cat([torch.arange(rows, device=self.device),
                           torch.zeros(size - rows, dtype=torch.long, device=self.device)])
        for (kc, vc), (ak, av) in zip(runner.cache, self.cache):
            for src, dst in ((kc, ak), (vc, av)):
                dst[:size, :, :P].copy_(src[:, :, :P] if size == rows else src[index, :, :P])
                dst[:size, :, P:].zero_()  # slots not yet written: zero, not stale memory
        S = runner.key_bias.shape[-1]
        self.key_bias[:size].zero_()
        self.key_bias[:size, ..., :S].copy_(runner.key_bias[index])
        self.next_pos[:size].copy_(runner.next_pos[index])
        self.slot.fill_(P)
        self.point(runner, size)

    def gather(self, runner, index: torch.Tensor) -> None:
        """Rows `index` [size'] of the current bucket to the front (a smaller bucket)."""
        size = len(index)
        for ak, av in self.cache:
            ak[:size].copy_(ak[index])  # ak[index] is a copy: no overlap
            av[:size].copy_(av[index])
        for buf in (self.key_bias, self.next_pos, self.tokens):
            buf[:size].copy_(buf[index])
        self.point(runner, size)

    def point(self, runner, size: int, length: int | None = None) -> None:
        """The runner's decode state as views of the first `size` rows and `length` cache slots
        (fixed addresses; attention reads those slots only)."""
        length = self.length if length is None else length
        runner.cache = [(ak[:size, :, :length], av[:size, :, :length]) for ak, av in self.cache]
        runner.key_bias, runner.next_pos = self.key_bias[:size, ..., :length], self.next_pos[:size]
        vars(runner).update(self.rope)


class DecodeGraphs:
    """The engine's arenas and their steps, kept across calls. An arena is leased to one
    group at a time (interleaved generations each get their own); `clear()` drops them."""

    def __init__(self) -> None:
        self.idle: list[Arena] = []
        self.captures = 0  # steps made (CUDA graphs captured on a GPU; decisions on a CPU)

    def lease(self, runner, rows: int) -> Arena:
        """An idle arena of this group's cache-length bucket holding `rows` rows, else a new
        one (the idle ones of that length are dropped first: their memory, their graphs)."""
        dtype, device = runner.embed.dtype, runner.embed.device
        length = length_bucket(runner.cache[0][0].shape[2])
        fits = [a for a in self.idle if (a.length, a.dtype, a.device) == (length, dtype, device)]
        for arena in fits:
            if arena.capacity >= rows:
                self.idle.remove(arena)
                return arena
        self.idle = [a for a in self.idle if a not in fits]
        return Arena(runner, bucket_for(rows), length, dtype, device)

    def give_back(self, arena: Arena) -> None:
        self.idle.append(arena)

    def idle_bytes(self) -> int:
        return sum(a.nbytes() for a in self.idle)

    def step(self, arena: Arena, runner, size: int, length: int, mode: str,
             sampling: SamplingParams | None = None) -> Callable:
        """The arena's step for bucket `size` x `length` cache slots (the runner pointed at
        them: `Arena.point`) over the runner's current weights (made, and counted, the first
        time): logits [size, V] of the tokens in arena.tokens[:size], or
        with `sampling` those logits sampled inside the step with the draws in arena.u[:size]
        (tokens [size], logprobs [size])."""
        key = weights_key(runner)
        if key != arena.weights:  # other weights (addresses): the old graphs would read freed memory
            arena.steps, arena.weights = {}, key
        how = None if sampling is None else (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p)
        if (size, length, how) not in arena.steps:
            tokens, u, slots = arena.tokens[:size], arena.u[:size], arena.slots[:length]
            draws = sampling is not None and needs_draw(sampling)

            def step():  # reads the cache, positions, bias through the runner's attributes
                logits = runner.decode_step(tokens, arena.slot, slots)  # [size, V]
                return logits if sampling is None else sample_with(logits, sampling, u if draws else None)
            arena.steps[size, length, how] = GraphedStep(step, arena.device) if mode == "graph" else step
            self.captures += 1
        return arena.steps[size, length, how]

    def clear(self) -> None:
        self.idle = []


class StaticDecoder:
    """Decode steps of one group (after `runner.start`) in an arena of `graphs`' (see the module
    docstring). step: one of STEPS. close(): the group is over, the arena goes back."""

    def __init__(self, runner, rows: int, step: str = "graph", graphs: DecodeGraphs | None = None,
                 sampling: SamplingParams | None = None):
        if step not in STEPS:
            raise ValueError(f"step must be one of {STEPS}, got {step!r}")
        self.runner, self.rows, self.sampling = runner, rows, sampling
        self.graphs = graphs if graphs is not None else DecodeGraphs()
        device = runner.next_pos.device
        self.mode = "fixed" if step == "graph" and device.type not in GRAPH_DEVICES else step
        self.arena = self.graphs.lease(runner, rows)
        self.size, self.k = bucket_for(rows), rows  # bucket rows, logical rows
        self.arena.load(runner, rows, self.size)  # the prefill's own cache is dropped with it
        self.filled = runner.slot  # host count of the slots written: the next one (no device read)
        self.length = self._length()
        self.phys: torch.Tensor | None = None  # [k] logical -> bucket row; None: the first k
        self.tokens = self.arena.tokens[:self.size]  # [size] step input
        self.slot, self.slots = self.arena.slot, self.arena.slots
        self.step = self._make_step()
        self.buckets_used = [self.size]

    def _length(self) -> int:
        """The slots the next step attends over: the filled ones, rounded up to a bucket."""
        return min(length_bucket(self.filled + 1), self.arena.length)

    def _make_step(self) -> Callable[[], torch.Tensor]:
        self.arena.point(self.runner, self.size, self.length)
        return self.graphs.step(self.arena, self.runner, self.size, self.length, self.mode, self.sampling)

    def select(self, keep: torch.Tensor) -> None:
        """Keep these logical rows (keep [k'] indices into the current k), in this order."""
        phys = keep if self.phys is None else self.phys[keep]  # [k'] bucket rows
        self.k = len(keep)
        size = bucket_for(self.k)
        if size == self.size:
            self.phys = phys
            return
        # into the smaller bucket: live rows first, padded with copies of the first one
        self.arena.gather(self.runner, torch.cat([phys, phys[:1].expand(size - self.k)]))
        self.tokens = self.arena.tokens[:size]
        self.size, self.phys = size, None
        self.step = self._make_step()
        self.buckets_used.append(size)

    def decode(self, tokens: torch.Tensor, u: torch.Tensor | None = None):
        """Feed one token per logical row (tokens [k]); returns their next-token logits [k, V],
        or with `sampling` the next tokens and logprobs ([k], [k]) drawn with u [k, 1] (on a
        GPU views of the graph's output: read them before the next `decode`)."""
        if self._length() != self.length:  # the filled slots outgrew the step's: a longer one
            self.length = self._length()
            self.step = self._make_step()
        self._put(self.tokens, tokens)
        if u is not None:
            self._put(self.arena.u[:self.size], u)
        out = self.step()  # [size, V] | ([size], [size])
        self.filled += 1
        self.slot.add_(1)
        self.runner.next_pos.add_(1)
        if isinstance(out, tuple):
            return tuple(self._logical(o) for o in out)
        return self._logical(out)

    def _put(self, buf: torch.Tensor, values: torch.Tensor) -> None:
        """Logical rows' values into their bucket rows of buf [size, ...]."""
        if self.phys is None:
            buf[:self.k].copy_(values)
        else:
            buf.index_copy_(0, self.phys, values)

    def _logical(self, out: torch.Tensor) -> torch.Tensor:
        return out[:self.k] if self.phys is None else out.index_select(0, self.phys)

    def close(self) -> None:
        """The group is done (or dropped): its arena, with its steps, is free for the next."""
        if self.arena is not None:
            self.graphs.give_back(self.arena)
            self.arena = None
