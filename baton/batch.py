"""`Batch`: the container that crosses worker boundaries.

A Batch holds
  * `tensors`: named tensors that share a leading batch dimension,
  * `non_tensors`: per-sample Python objects (strings, dicts, ids) kept as numpy object
    arrays so that row selection is one fancy-index,
  * `meta`: batch-level values (a policy version, a temperature, timing) that are not
    split across ranks.

Why not tensordict: `TensorDict` covers the tensor half well, but per-sample strings and
dicts need `NonTensorStack`, whose chunk/cat semantics and pickling change between
releases, and tensordict pins torch versions tightly (a risk for the exact torch pin this
project needs). The operations RL needs are few (select, chunk with padding, concat,
repeat, union, mini-batches), so a ~200-line container with explicit semantics wins.

Transport: `__getstate__` turns every tensor into a numpy array (bf16 is viewed as int16),
so pickle protocol 5 (which Ray uses) ships the buffers out of band - one memcpy per
tensor, never element by element. See bench/batch_transport.py for the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from baton.fields import LEFT_PADDED, PAD_VALUES

PAD_KEY = "_pad"  # meta key: how many trailing rows of this batch are padding


def _as_object_array(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):  # element-wise so lists/tuples stay single objects
        arr[i] = v
    return arr


def _cat_padded(key: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat along rows; [N, W] tensors of different widths are zero-padded to the widest
    (on the left for prompt fields, see fields.LEFT_PADDED), as rows from different ranks are."""
    widths = {t.shape[1:] for t in tensors}
    if len(widths) > 1 and all(t.dim() >= 2 and t.shape[2:] == tensors[0].shape[2:] for t in tensors):
        width = max(t.shape[1] for t in tensors)
        left, value = key in LEFT_PADDED, PAD_VALUES.get(key, 0)
        tail = (0, 0) * (tensors[0].dim() - 2)  # [N, W, ...] (routing): padded along W only
        tensors = [torch.nn.functional.pad(t, (*tail, width - t.shape[1], 0) if left else (*tail, 0, width - t.shape[1]),
                                           value=value) for t in tensors]
    return torch.cat(tensors)


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and all(x == y for x, y in zip(a.tolist(), b.tolist()))
    return a == b


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensors = {k: v if isinstance(v, np.ndarray) and v.dtype == object
                            else _as_object_array(v) for k, v in self.non_tensors.items()}
        self._check_lengths()

    # --- construction and access -----------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], meta: dict[str, Any] | None = None) -> "Batch":
        """Tensors go to `tensors`; lists / arrays of objects go to `non_tensors`."""
        tensors, non_tensors = {}, {}
        for k, v in data.items():
            (tensors if isinstance(v, torch.Tensor) else non_tensors)[k] = v
        return cls(tensors, non_tensors, dict(meta or {}))

    def _check_lengths(self) -> None:
        lengths = {k: t.shape[0] if t.dim() else None for k, t in self.tensors.items()}
        lengths.update({k: len(v) for k, v in self.non_tensors.items()})
        bad = [k for k, n in lengths.items() if n is None]
        if bad:
            raise ValueError(f"Batch tensor {bad[0]!r} is a scalar; put batch-level values in meta")
        if len(set(lengths.values())) > 1:
            raise ValueError(f"Batch fields disagree on the batch size: {lengths}")

    def __len__(self) -> int:
        for t in self.tensors.values():
            return t.shape[0]
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(f"Batch has no field {key!r}; it has {self.keys()}")

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.dim() == 0:
                raise ValueError(f"Batch tensor {key!r} is a scalar; put batch-level values in meta")
            rows = value.shape[0]
        else:
            value = value if isinstance(value, np.ndarray) and value.dtype == object else _as_object_array(value)
            rows = len(value)
        others = [k for k in self.keys() if k != key]
        n = len(self[others[0]]) if others else rows
        if rows != n:  # checked before storing: a failed assignment leaves the batch as it was
            raise ValueError(f"field {key!r} has {rows} rows, the batch has {n}")
        if isinstance(value, torch.Tensor):
            self.non_tensors.pop(key, None)
            self.tensors[key] = value
        else:
            self.tensors.pop(key, None)
            self.non_tensors[key] = value

    def __delitem__(self, key: str) -> None:
        if self.tensors.pop(key, None) is None and self.non_tensors.pop(key, None) is None:
            raise KeyError(key)

    def __repr__(self) -> str:
        t = ", ".join(f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
                      for k, v in self.tensors.items())
        return f"Batch(len={len(self)}, tensors={{{t}}}, non_tensors={list(self.non_tensors)}, meta={list(self.meta)})"

    # --- selection -------------------------------------------------------------------
    def select(self, *keys: str, meta: bool = True) -> "Batch":
        """A batch with only `keys` (tensors are shared, not copied)."""
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"Batch has no field {missing[0]!r}; it has {self.keys()}")
        return Batch({k: v for k, v in self.tensors.items() if k in keys},
                     {k: v for k, v in self.non_tensors.items() if k in keys},
                     dict(self.meta) if meta else {})

    def rows(self, index: slice | Sequence[int] | torch.Tensor) -> "Batch":
        """Select rows by slice, index list, index tensor or boolean mask."""
        if isinstance(index, slice):
            np_index: Any = index
            t_index: Any = index
        else:
            t_index = torch.as_tensor(index)
            if t_index.dtype == torch.bool:
                t_index = t_index.nonzero().flatten()
            t_index = t_index.long()
            np_index = t_index.numpy()
        meta = {k: v for k, v in self.meta.items() if k != PAD_KEY}
        return Batch({k: v[t_index] for k, v in self.tensors.items()},
                     {k: v[np_index] for k, v in self.non_tensors.items()}, meta)

    # --- split and join --------------------------------------------------------------
    def unpadded(self) -> "Batch":
        """This batch without its trailing padding rows (meta[PAD_KEY]), if it has any."""
        pad = self.meta.get(PAD_KEY, 0)
        return self.rows(slice(0, len(self) - pad)) if pad else self

    def pad_to_multiple(self, n: int) -> tuple["Batch", int]:
        """Append copies of the first rows so that len is divisible by n (padding this batch
        already carries is dropped first, so re-chunking a chunk stays exact)."""
        self = self.unpadded()
        pad = (-len(self)) % n
        if pad == 0:
            return self, 0
        if len(self) == 0:
            raise ValueError("cannot pad an empty batch")
        idx = torch.arange(pad) % len(self)
        return Batch.concat([self, self.rows(idx)]), pad

    def chunk(self, n: int) -> list["Batch"]:
        """Split into n equal chunks, padding first; each chunk's meta[PAD_KEY] counts its
        trailing padding rows, which `Batch.concat` drops again."""
        padded, pad = self.pad_to_multiple(n)
        size = len(padded) // n
        chunks = [padded.rows(slice(i * size, (i + 1) * size)) for i in range(n)]
        real = len(padded) - pad
        for i, c in enumerate(chunks):
            c.meta[PAD_KEY] = max(0, min(size, (i + 1) * size - real))
        return chunks

    @staticmethod
    def concat(parts: Sequence["Batch"]) -> "Batch":
        """Concatenate along rows, dropping each part's trailing padding (meta[PAD_KEY]).
        Meta is taken from the first part."""
        if not parts:
            raise ValueError("Batch.concat needs at least one batch")
        parts = [p.unpadded() for p in parts]
        keys = parts[0].keys()
        for p in parts[1:]:
            if sorted(p.keys()) != sorted(keys):
                raise ValueError(f"Batch.concat: fields differ: {sorted(keys)} vs {sorted(p.keys())}")
        meta = {k: v for k, v in parts[0].meta.items() if k != PAD_KEY}
        return Batch({k: _cat_padded(k, [p.tensors[k] for p in parts]) for k in parts[0].tensors},
                     {k: np.concatenate([p.non_tensors[k] for p in parts]) for k in parts[0].non_tensors},
                     meta)

    def padding_mask(self) -> torch.Tensor:
        """[B] bool: True on the trailing rows that are dispatch padding (meta[PAD_KEY])."""
        device = next((t.device for t in self.tensors.values()), None)  # the rows' device (a worker's)
        mask = torch.zeros(len(self), dtype=torch.bool, device=device)
        pad = self.meta.get(PAD_KEY, 0)
        if pad:
            mask[len(self) - pad:] = True
        return mask

    def repeat(self, n: int, interleave: bool = True) -> "Batch":
        """Repeat every row n times: interleaved gives a a b b (one group per prompt).

        Interleaved, trailing padding rows stay trailing (n copies each), so the result
        carries meta[PAD_KEY] * n; tiled (a b a b) padding would be scattered: refused."""
        pad = self.meta.get(PAD_KEY, 0)
        if interleave:
            idx = torch.arange(len(self)).repeat_interleave(n)
        else:
            if pad:
                raise ValueError("Batch.repeat(interleave=False) of a padded batch would scatter its "
                                 "padding rows; call .unpadded() first")
            idx = torch.arange(len(self)).repeat(n)
        out = self.rows(idx)
        if pad:
            out.meta[PAD_KEY] = pad * n
        return out

    def union(self, other: "Batch") -> "Batch":
        """Merge fields and meta; an overlapping key must hold equal values."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"Batch.union: lengths differ ({len(self)} vs {len(other)})")
        out = Batch(dict(self.tensors), dict(self.non_tensors), dict(self.meta))
        for src, dst in ((other.tensors, out.tensors), (other.non_tensors, out.non_tensors),
                         (other.meta, out.meta)):
            for k, v in src.items():
                if k in dst and not _values_equal(dst[k], v):
                    raise ValueError(f"Batch.union: key {k!r} differs between the two batches")
                dst[k] = v
        return out

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch({k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors.items()},
                     dict(self.non_tensors), dict(self.meta))

    def minibatches(self, size: int, *, seed: int | None = None, shuffle: bool = True,
                    drop_last: bool = False) -> Iterator["Batch"]:
        """Mini-batches of `size` rows; a seed makes the order reproducible."""
        if size <= 0:
            raise ValueError("mini-batch size must be positive")
        n = len(self)
        if shuffle:
            # No seed: draw from the global generator (torch.seed() would re-seed it, a side
            # effect on every later random op of the caller).
            g = torch.Generator().manual_seed(seed) if seed is not None else None
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        for start in range(0, n, size):
            idx = order[start:start + size]
            if drop_last and len(idx) < size:
                return
            yield self.rows(idx)

    # --- transport -------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        tensors = {}
        for k, t in self.tensors.items():
            t = t.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            dtype = str(t.dtype).removeprefix("torch.")
            if t.dtype == torch.bfloat16:
                t = t.view(torch.int16)
            tensors[k] = (np.ascontiguousarray(t.numpy()), dtype)
        return {"tensors": tensors, "non_tensors": self.non_tensors, "meta": self.meta}

    def __setstate__(self, state: dict[str, Any]) -> None:
        tensors = {}
        for k, (arr, dtype) in state["tensors"].items():
            if not arr.flags.writeable:  # out-of-band buffers from Ray are read-only
                arr = arr.copy()
            t = torch.from_numpy(arr)
            if dtype == "bfloat16":
                t = t.view(torch.bfloat16)
            tensors[k] = t
        self.tensors, self.non_tensors, self.meta = tensors, state["non_tensors"], state["meta"]


def collate(rows: Iterable[dict[str, Any]]) -> Batch:
    """Build a Batch from per-sample dicts of non-tensor values (e.g. dataset rows)."""
    rows = list(rows)
    keys = rows[0].keys() if rows else []
    return Batch(non_tensors={k: _as_object_array([r[k] for r in rows]) for k in keys})
