"""A CUDA graph's replay checked on the CPU: `ReplayChecker` stands in for
`baton.rollout.embedded.cuda_graphs.GraphedStep` (and turns static decode's "graph" step on for CPU
devices), so that what a replay would read wrongly on a GPU fails a CPU run.

A captured graph replays its kernels on the addresses it recorded. So at capture the stand-in
runs the step eagerly under a `TorchDispatchMode` and records, in order, every storage the step
reads that it did not make itself (its *outside* reads: the arena's buffers, the weights, the
RoPE tables...): storage address, offset, shape, stride, dtype, and a weak reference to the
storage. At each replay it runs the step eagerly again, recording the same way, and the replay
is bad when
  * a captured outside storage has been freed (the graph would read memory the caching
    allocator may have handed to something else; on the CPU the address may even be reused
    by chance, so liveness is checked by reference, not by address), or
  * the eager step now reads an outside storage other than the captured one (another
    address, offset, shape or stride): the graph would read the old one.
A capture that holds a host sync (`.item()`, `.tolist()`, `bool(t)`, `.cpu()`, `.numpy()`, or
an op whose output size depends on values: what `torch.cuda.set_sync_debug_mode` reports on a
GPU, or what fails a capture there) is a fault too, recorded at capture.

The eager result is copied into the output tensors the capture returned, and those are what
each replay returns, as a graph's are: a caller that keeps a step's output past the next
replay sees it overwritten, as on a GPU.

Tests check `checker.bad` is empty (`assert_clean`): tests/rollout/test_graph_replay.py
(and the engine's graph tests under it), tests/test_device_faults.py's recipe rows.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

T = torch.Tensor
HOST_READS = {T.item, T.tolist, T.__bool__, T.__int__, T.__float__, T.__index__, T.numpy, T.cpu}
aten = torch.ops.aten
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
            aten.unique_consecutive.default, aten._unique2.default, aten.repeat_interleave.Tensor}
MASK_INDEX = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


def _where() -> str:
    frame = next((f for f in reversed(traceback.extract_stack()[:-3]) if "/baton/" in f.filename), None)
    return f"{frame.filename.split('/baton/')[-1]}:{frame.lineno}" if frame else "?"


class _Reads(TorchDispatchMode):
    """Records the step's outside reads (see the module docstring) and its host syncs."""

    def __init__(self) -> None:
        super().__init__()
        self.outside: list[tuple] = []  # (storage address, offset, shape, stride, dtype, op)
        self.refs: list[StorageWeakRef] = []  # one per outside storage, at its first read
        self.syncs: list[str] = []
        self._seen: set[int] = set()  # outside storages' addresses
        self._made: set[int] = set()  # storages the step allocated

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNC_OPS or (func in MASK_INDEX and any(  # a bool mask as an index: nonzero inside
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in tree_flatten(args[1])[0])):
            self.syncs.append(f"{func} at {_where()}")
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._read(t, func)
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in self._seen:
                    self._made.add(ptr)
        return out

    def _read(self, t: torch.Tensor, func) -> None:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr in self._made or s.nbytes() == 0:
            return
        if ptr not in self._seen:
            self._seen.add(ptr)
            self.refs.append(StorageWeakRef(s))
        self.outside.append((ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, str(func)))


class _HostReads(TorchFunctionMode):
    """Host reads a graph cannot hold (they run through torch functions, not aten ops)."""

    def __init__(self, syncs: list[str]) -> None:
        super().__init__()
        self.syncs = syncs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS or (func is T.to and any(
                str(a).startswith("cpu") for a in (*args[1:], *(kwargs or {}).values()) if isinstance(a, (str, torch.device)))):
            self.syncs.append(f"{getattr(func, '__name__', func)} at {_where()}")
        return func(*args, **(kwargs or {}))


def _record(fn: Callable[[], Any]) -> tuple[Any, _Reads]:
    reads = _Reads()
    with _HostReads(reads.syncs), reads:
        out = fn()
    return out, reads


class ReplayCheckedStep:
    """GraphedStep's stand-in: fn() captured at its first call, each later call a checked replay."""

    def __init__(self, fn: Callable[[], Any], device: torch.device, checker: "ReplayChecker"):
        self.fn, self.device, self.checker = fn, device, checker
        self.captured: _Reads | None = None
        self.out: Any = None

    def __call__(self) -> Any:
        if self.captured is None:
            out, self.captured = _record(self.fn)
            self.checker.captures += 1
            if self.captured.syncs:
                self.checker.bad.append(f"capture holds host syncs: {self.captured.syncs[:3]}")
            self.out = tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()
            return out  # the warm-up's real result, as GraphedStep returns it
        self.checker.replays += 1
        dead = sum(ref.expired() for ref in self.captured.refs)
        out, now = _record(self.fn)
        problem = f"{dead} captured storage(s) freed before the replay" if dead else self._compare(now)
        if problem is not None:
            self.checker.bad.append(problem)
        for dst, src in zip(self.out if isinstance(self.out, tuple) else (self.out,),
                            out if isinstance(out, tuple) else (out,)):
            dst.copy_(src)
        return self.out

    def _compare(self, now: _Reads) -> str | None:
        """The first outside read that differs from the capture's (None: all the same)."""
        for want, got in zip(self.captured.outside, now.outside):
            if want[:5] != got[:5]:
                return f"{got[5]} reads {got[:4]}, captured {want[:4]}"
        if len(now.outside) != len(self.captured.outside):
            return f"{len(now.outside)} outside reads, captured {len(self.captured.outside)}"
        return None


class ReplayChecker:
    """Installed with `install(monkeypatch)`: static decode's "graph" steps on CPU devices
    too, each a `ReplayCheckedStep`. bad: one line per bad replay or faulty capture."""

    def __init__(self) -> None:
        self.captures = self.replays = 0
        self.bad: list[str] = []

    def install(self, monkeypatch) -> "ReplayChecker":
        from baton.rollout.embedded import static_decode

        monkeypatch.setattr(static_decode, "GRAPH_DEVICES", (*static_decode.GRAPH_DEVICES, "cpu"))
        monkeypatch.setattr(static_decode, "GraphedStep", lambda fn, device: ReplayCheckedStep(fn, device, self))
        return self

    def assert_clean(self) -> None:
        assert not self.bad, (f"{len(self.bad)} bad of {self.replays} replays / {self.captures} captures: "
                              f"{self.bad[:4]}")
