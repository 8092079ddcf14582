"""Static decode: the fast runner's decode step over fixed-shape, fixed-address buffers, so
that on a GPU it runs as one CUDA graph replay per token instead of ~20 launches per layer.

`StaticDecoder` sits between the engine's decode loop and a `LlamaRunner` after its prefill,
with the runner's interface (`decode(tokens)`, `select(keep)`):

  * batch-size buckets: the group's rows, then the powers of two below it (128 rows: 128,
    64, 32, ..., 1). The KV cache, key bias, positions and the token buffer are sized to the
    current bucket; one step function (a CUDA graph on a GPU) per bucket, made when the batch
    first enters it;
  * the loop's rows ("logical", the rows it samples) map to bucket rows ("physical") through
    `phys`: dropping finished rows only changes the map until the logical rows fit a smaller
    bucket; then the live rows are gathered into it (padded with copies of one live row,
    whose results nobody reads) and a step for that bucket is made;
  * the cache slot is a device tensor, advanced in place with the rows' positions;
  * everything, graphs included, lives for one group of one `generate` call (a graph holds
    the addresses of the weights, which `pack()` and the sleep modes move between calls);
    a capture costs about one eager step, paid once per bucket the group enters.

The step (`LlamaRunner.decode_step` with a device-tensor slot) attends over all cache slots, the
unfilled ones masked (and zeroed here, so no 0 * NaN from uninitialised memory): fixed
shapes, no host value. It runs in one of two ways (STEPS):
  "fixed"   eagerly (a CPU; on a GPU for comparison);
  "graph"   captured as a CUDA graph per bucket (`baton.rollout.cuda_graphs`, the only part
            not run on a CPU; on a CPU "graph" runs as "fixed").
Sampling stays outside the step, on the logical rows, so a seed draws the same numbers as
the runner's own decode does. fp32 on a CPU gives the default path's tokens; logprobs differ
by rounding only (measured <= 5e-6): SDPA sums over the masked slots too, and a matmul's
kernel (so its rounding) depends on the batch's row count, which padding to a bucket
changes (tests/rollout/test_static_decode.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from baton.rollout.cuda_graphs import GraphedStep

STEPS = ("fixed", "graph")


def bucket_sizes(rows: int) -> list[int]:
    """[rows, then the powers of two below it], descending: the batch sizes a group's decode
    step is made for."""
    sizes, p = [rows], 1
    while p < rows:
        sizes.append(p)
        p *= 2
    return sorted(set(sizes), reverse=True)


def bucket_for(k: int, rows: int) -> int:
    """The smallest bucket of a `rows`-row group that holds k rows."""
    return min(s for s in bucket_sizes(rows) if s >= k)


class StaticDecoder:
    """Decode steps of one group (after `runner.start`) in bucket-sized static buffers.

    step: one of STEPS (see the module docstring)."""

    def __init__(self, runner, rows: int, step: str = "graph"):
        if step not in STEPS:
            raise ValueError(f"step must be one of {STEPS}, got {step!r}")
        self.runner, self.rows = runner, rows
        device = runner.next_pos.device
        for kc, vc in runner.cache:  # slots not yet written: zero, not uninitialised memory
            kc[:, :, runner.slot:].zero_()
            vc[:, :, runner.slot:].zero_()
        self.slots = torch.arange(runner.cache[0][0].shape[2], device=device)  # [S]
        self.slot = torch.tensor([runner.slot], device=device)  # [1] next cache slot
        self.mode = "fixed" if step == "graph" and device.type != "cuda" else step
        self.size = self.k = rows  # bucket rows, logical rows
        self.phys: torch.Tensor | None = None  # [k] logical -> bucket row; None: the first k
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)  # [size] step input
        self.step = self._make_step()
        self.buckets_used = [rows]

    def _make_step(self) -> Callable[[], torch.Tensor]:
        def step() -> torch.Tensor:  # [size, V]; reads the buffers through the runner's attributes
            return self.runner.decode_step(self.tokens, self.slot, self.slots)
        return GraphedStep(step, self.slot.device) if self.mode == "graph" else step

    def select(self, keep: torch.Tensor) -> None:
        """Keep these logical rows (keep [k'] indices into the current k), in this order."""
        phys = keep if self.phys is None else self.phys[keep]  # [k'] bucket rows
        self.k = len(keep)
        size = bucket_for(self.k, self.rows)
        if size == self.size:
            self.phys = phys
            return
        # into the smaller bucket: live rows first, padded with copies of the first one
        index = torch.cat([phys, phys[:1].expand(size - self.k)])  # [size]
        self.step = None  # drop the old bucket's graph (and its memory pool) first
        self.runner.select(index)  # cache, key bias, positions
        self.tokens = self.tokens[index]
        self.size, self.phys = size, None
        self.step = self._make_step()
        self.buckets_used.append(size)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per logical row (tokens [k]); returns their next-token logits [k, V]
        (on a GPU a view of the graph's output: read it before the next `decode`)."""
        if self.phys is None:
            self.tokens[:self.k].copy_(tokens)
        else:
            self.tokens.index_copy_(0, self.phys, tokens)
        logits = self.step()  # [size, V]
        self.slot.add_(1)
        self.runner.next_pos.add_(1)
        return logits[:self.k] if self.phys is None else logits.index_select(0, self.phys)
