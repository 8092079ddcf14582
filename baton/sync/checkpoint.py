"""Weight sync through a safetensors file: write atomically, then have each engine reload it.

The file is written to a temp name in the target directory and `os.replace`d into place,
so a reader never sees a half-written file. Each engine then loads it:
  - an engine with `update_weights_from_disk(path, version)` (a `RemoteEngine`, i.e. a
    server's `/update_weights_from_disk`) reloads the path itself - the server must see
    the same filesystem;
  - any other engine (in process) gets the file's tensors via `update_weights`.
Either way every tensor read is checked against the digest of what was written first
(`baton.sync.digest`): a mismatch is refused naming the tensor, the engine keeps its version.
Once every engine holds a version this transport pushed, a push writes only the tensors
that changed since (`baton.sync.delta`).
Only the newest `keep_last` files are kept.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from baton.sync.delta import Held, check_base, installed_as, weights_id
from baton.sync.digest import check_digests



def save_safetensors_atomic(named_params: Iterable[tuple[str, torch.Tensor]], path: str | os.PathLike) -> Path:
    """Write tensors to `path` (temp file + os.replace); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # safetensors wants contiguous CPU tensors that share no storage
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in named_params}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def safetensors_files(path: str | os.PathLike) -> list[Path]:
    """A .safetensors file, or every *.safetensors in a directory (HF shards), sorted."""
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(p.glob("*.safetensors"))
        if files:
            return files
        raise FileNotFoundError(f"no *.safetensors files in {str(p)!r}")
    raise FileNotFoundError(f"weights path not found: {str(p)!r}")


def iter_safetensors(path: str | os.PathLike, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from a file or checkpoint dir, one tensor at a time."""
    for f in safetensors_files(path):
        with safe_open(str(f), framework="pt", device=device) as fh:
            for name in fh.keys():
                yield name, fh.get_tensor(name)


class CheckpointSync:
    """`delta` (default): a file of only the tensors changed since the version every engine
    serves (`baton.sync.delta`); False: the whole model every push."""

    def __init__(self, engines, directory: str | os.PathLike | None = None, keep_last: int = 1, delta: bool = True):
        self.engines = list(engines) if isinstance(engines, (list, tuple)) else [engines]
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="baton-weights-"))
        self.keep_last = max(1, keep_last)
        self._written: list[Path] = []
        self.held = Held(delta)
        self.last: dict[str, float] = {}  # what the last push moved: sync/bytes, sync/seconds, sync/tensors

    def push(self, named_params: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Write the weights (only those changed since the version every engine serves: a
        delta, `baton.sync.delta`), then each engine loads them as `version` after checking
        every tensor it read against the digest of what was written (`baton.sync.digest`) and
        the delta's base against the version it serves: a file cut or corrupted on its way is
        refused naming the tensor, the old version kept."""
        tensors = [(name, t.detach().to("cpu").contiguous()) for name, t in named_params]
        self.last = self.held.push(self.engines, tensors, version, self._push)

    def _push(self, tensors: list[tuple[str, torch.Tensor]], every: dict[str, str], version: int,
              base: str | None) -> None:
        """Write `tensors` (a delta on the weights `base` names; None: all of them) and have
        every engine load them."""
        sent = {n: every[n] for n, _ in tensors}
        path = save_safetensors_atomic(tensors, self.directory / f"weights-v{version}.safetensors")
        if path not in self._written:
            self._written.append(path)
        while len(self._written) > self.keep_last:
            self._written.pop(0).unlink(missing_ok=True)
        for engine in self.engines:
            if engine.update_weights_from_disk is not None:  # a server: it checks before it installs
                engine.update_weights_from_disk(str(path), version, digests=sent, weights=weights_id(every),
                                                **({} if base is None else {"base_weights": base}))
            else:
                check_digests(iter_safetensors(path), sent)  # in process: checked here, then installed
                check_base(engine, base)
                engine.update_weights(iter_safetensors(path), version)
                installed_as(engine, weights_id(every))

    def close(self) -> None:
        for p in self._written:
            p.unlink(missing_ok=True)
        self._written = []
        if self._own_dir:
            try:
                self.directory.rmdir()
            except OSError:
                pass
