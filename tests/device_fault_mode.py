"""A device of its own on the CPU: `DeviceFaultMode` makes a worker's tensors behave as if they
lived on a GPU, so device faults show up in a CPU run (tests/test_device_faults.py).

The worker's device is `WORKER` (torch.device("cpu", 1): the workers are given it in place of
"cuda:0"; its tensors are ordinary CPU tensors underneath). A torch function mode tags each
tensor's storage as on the worker's device or on the host, as CUDA would place it:
  * `.to(WORKER)` / `device=WORKER` (factories, `torch.tensor`) give a device tensor, a copy
    (a real move copies: nothing the driver holds becomes a device tensor by aliasing);
  * `.to("cpu")` / `.cpu()` of a device tensor give a host copy;
  * every other op's outputs are on the device when any input is, else on the host, and
    `t.device` answers WORKER for a device tensor (code that follows a tensor's device moves
    its own tensors there, as on a GPU).
Faults: an op whose inputs mix device tensors with host tensors of more than one element
(CUDA accepts 0-dim CPU scalars, host indices, and `copy_` across devices), or `.numpy()` of
a device tensor, raises `DeviceFault` naming the op. Host reads of a device tensor
(`.item()`, `.tolist()`, `bool(t)`, `int(t)`, `float(t)`, `.cpu()` / `.to("cpu")`) are what a GPU
waits for: each is counted under the region it ran in (`in_region("generate")`, ...), for the
test to hold against a budget.
"""

from __future__ import annotations

import contextlib
import traceback
import weakref
from collections import Counter
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

WORKER = torch.device("cpu", 1)
HOST = torch.device("cpu")
T = torch.Tensor
READS = {T.item, T.tolist, T.__bool__, T.__int__, T.__float__, T.__index__}
TO_DEVICE = {T.to, T.cuda, T.cpu}
ACROSS = {T.copy_, T.__getitem__, T.__setitem__, T.index_select, T.index_put_, torch.index_select,  # host indices, copies
          torch._has_compatible_shallow_copy_type, T.set_, torch.utils.swap_tensors}  # moving parameters
FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange,
             torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace, torch.eye, torch.empty_strided}


class DeviceFault(RuntimeError):
    """A worker's device tensors met host tensors in one op (CUDA: "Expected all tensors to be
    on the same device")."""


class DeviceFaultMode(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self._device: weakref.WeakValueDictionary[int, torch.UntypedStorage] = weakref.WeakValueDictionary()
        self.reads: Counter[str] = Counter()  # region -> host reads of device tensors
        self.where: dict[str, str] = {}  # region -> the last read's caller (for a budget's message)
        self.region = "other"

    # --- tags ---------------------------------------------------------------------------
    def on_device(self, t: torch.Tensor) -> bool:
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, meta-less wrappers
            return False
        return self._device.get(s._cdata) is s

    def _tag(self, t: Any, device: bool) -> None:
        if isinstance(t, torch.Tensor) and device:
            s = t.untyped_storage()
            self._device[s._cdata] = s

    @contextlib.contextmanager
    def in_region(self, name: str) -> Iterator[None]:
        before, self.region = self.region, name
        try:
            yield
        finally:
            self.region = before

    # --- the mode -----------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        if owner is torch._C.TensorBase.device:  # t.device
            return WORKER if self.on_device(args[0]) else func(*args, **kwargs)
        if owner is torch._C.TensorBase.grad:  # p.grad: autograd made it beside p (unseen by this mode)
            out = func(*args, **kwargs)
            self._tag(out, self.on_device(args[0]))
            return out
        if type(owner).__name__ == "getset_descriptor":  # other attributes (t.shape, p.data = ...)
            return func(*args, **kwargs)
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        dev = [self.on_device(t) for t in tensors]
        if func is T.numpy and any(dev):  # CUDA refuses outright
            raise DeviceFault("numpy() of a worker-device tensor: move it to the CPU first")
        if func in READS and any(dev):
            self._read()
            return func(*args, **kwargs)
        if func in TO_DEVICE:
            return self._move(func, args, kwargs, any(dev))
        dest = _device_arg(kwargs.get("device"))
        if func in FACTORIES or dest is not None:
            out = func(*args, **_host_kwargs(kwargs))
            self._tag_all(out, dest == WORKER if dest is not None else any(dev))
            return out
        if any(dev) and not all(dev) and func not in ACROSS:
            host = [tuple(t.shape) for t, d in zip(tensors, dev) if not d and t.dim() > 0]
            if host:
                raise DeviceFault(f"{_name(func)} mixes worker-device tensors with CPU tensors of shapes {host}")
        out = func(*args, **kwargs)
        if any(dev) and func not in (T.__setitem__, T.copy_):
            self._tag_all(out, True)
        return out

    def _tag_all(self, out: Any, device: bool) -> None:
        if device:
            tree_map(lambda x: self._tag(x, True), out)

    def _dest(self, func, args, kwargs) -> torch.device | None:
        """Where `t.to(...)` / `.cpu()` / `.cuda()` sends its tensor (None: nowhere: a dtype change)."""
        if func is T.cpu:
            return HOST
        if func is T.cuda:
            return WORKER
        for a in (*args[1:], kwargs.get("device"), kwargs.get("other")):
            if isinstance(a, torch.Tensor):
                return WORKER if self.on_device(a) else HOST
            d = _device_arg(a) if isinstance(a, (str, torch.device)) else None
            if d is not None:
                return d
        return None

    def _move(self, func, args, kwargs, on_device: bool):
        t, dest = args[0], self._dest(func, args, kwargs)
        out = t if func is T.cuda else func(*args, **kwargs)  # cpu:1 is the CPU underneath
        if dest is None or (dest == WORKER) == on_device:
            self._tag(out, on_device)  # a dtype change, or already there
            return out
        if on_device:  # device -> host: the host waits for it
            self._read()
        if out.untyped_storage()._cdata == t.untyped_storage()._cdata:
            out = out.clone()  # a real move copies
        self._tag(out, dest == WORKER)
        return out

    def _read(self) -> None:
        self.reads[self.region] += 1
        frame = next((f for f in reversed(traceback.extract_stack(limit=12)[:-3])
                      if "/baton/" in f.filename), None)
        if frame is not None:
            self.where[self.region] = f"{frame.filename.split('/baton/')[-1]}:{frame.lineno}"


def _device_arg(d: Any) -> torch.device | None:
    if d is None:
        return None
    if isinstance(d, str) and d not in ("cpu", "cuda") and ":" not in d and d != "meta":
        return None  # a dtype name or similar
    try:
        d = torch.device(d)
    except (RuntimeError, TypeError):
        return None
    return WORKER if d.type == "cuda" or d == WORKER else HOST if d.type == "cpu" else None


def _host_kwargs(kwargs: dict) -> dict:
    """A factory's keyword arguments with the worker's device made the CPU (its real storage)."""
    return {k: (HOST if k == "device" and _device_arg(v) == WORKER else v) for k, v in kwargs.items()}


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
