"""What keeps `baton serve`'s admin endpoints and weight loading from being misused (the
request guards it shares with the gateway, API key, body cap, strict JSON, OpenAI-shaped
errors, are in `baton/http/`).

  check_admin_request  admin endpoints take only `Content-Type: application/json` (415) and
                    no cross-site browser request (an `Origin` that is not this host, or
                    `Sec-Fetch-Site: cross-site`: 403): a web page the user opens can send a
                    form or text/plain POST to 127.0.0.1 without a CORS preflight, never a
                    JSON one, so with no API key nothing a page sends reaches the engine.
  WeightsAllowList  a weights path is resolved (symlinks, `..`) and must lie inside one of
                    the allowed directories (403 otherwise), and be .safetensors (400).
  open_checkpoint / check_checkpoint
                    every tensor of a checkpoint is read once and checked (known name, right
                    shape, finite values) before the engine installs any of it, so a bad file
                    is rejected whole and the old weights keep serving.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from fastapi import HTTPException, Request


# --- admin requests ------------------------------------------------------------------------
def check_admin_request(request: Request) -> None:
    """HTTPException 415 / 403 for an admin request a browser could have sent cross-site."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise HTTPException(415, f"admin endpoints take only 'Content-Type: application/json' (got "
                                 f"{ctype or 'none'!r}); send a JSON body, e.g. {{}}")
    if request.headers.get("sec-fetch-site", "").lower() == "cross-site":
        raise HTTPException(403, "cross-site browser requests may not call admin endpoints")
    origin = request.headers.get("origin")
    if origin is not None:
        host = request.headers.get("host", "")
        if origin.split("://", 1)[-1].rstrip("/") != host:
            raise HTTPException(403, f"Origin {origin!r} is not this server ({host!r}): browser requests from "
                                     f"other sites may not call admin endpoints")


# --- weights from disk ---------------------------------------------------------------------
class WeightsAllowList:
    """Directories weights may be loaded from; `None` allows any path (in-process servers
    whose owner decides, see `build_app`)."""

    def __init__(self, dirs: Sequence[str | os.PathLike] | None):
        self.dirs = None if dirs is None else [Path(d).resolve() for d in dirs]

    def describe(self) -> str:
        return "any directory" if self.dirs is None else ", ".join(map(str, self.dirs)) or "nowhere"

    def _inside(self, p: Path) -> bool:
        return self.dirs is None or any(p == d or p.is_relative_to(d) for d in self.dirs)

    def files(self, model_path: str) -> list[Path]:
        """The resolved .safetensors files `model_path` names (a file, or a directory of
        shards). HTTPException 403 outside the allow-list, 400 for anything else wrong."""
        if not model_path or "\x00" in model_path:
            raise HTTPException(400, "model_path must be a non-empty path")
        try:
            path = Path(model_path).resolve()  # symlinks and '..' resolved before the check
        except (OSError, RuntimeError) as exc:  # e.g. a symlink loop
            raise HTTPException(400, f"cannot resolve model_path: {exc}") from exc
        if not self._inside(path):
            raise HTTPException(403, f"model_path {model_path!r} resolves to {str(path)!r}, outside the directories "
                                     f"this server may load weights from ({self.describe()}; see --weights-dir)")
        if path.is_dir():
            files = sorted(f.resolve() for f in path.glob("*.safetensors"))
            if not files:
                raise HTTPException(400, f"no *.safetensors files in {str(path)!r}")
        elif path.is_file():
            files = [path]
        else:
            raise HTTPException(400, f"weights path not found: {model_path!r}")
        for f in files:
            if not self._inside(f):  # a shard that is a symlink out of the allowed tree
                raise HTTPException(403, f"{str(f)!r} lies outside the allowed weights directories")
            if f.suffix != ".safetensors" or not f.is_file():
                raise HTTPException(400, f"{str(f)!r} is not a .safetensors file (only safetensors are loaded)")
        return files


@contextlib.contextmanager
def open_checkpoint(files: Sequence[Path]) -> Iterator[list[Any]]:
    """safe_open handles for `files` (kept open: both passes read the same file contents,
    whatever happens to the paths meanwhile). HTTPException 400 if one is not safetensors."""
    from safetensors import safe_open

    with contextlib.ExitStack() as stack:
        handles = []
        for f in files:
            try:
                handles.append(stack.enter_context(safe_open(str(f), framework="pt", device="cpu")))
            except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: the file is the problem
                raise HTTPException(400, f"{str(f)!r} is not a readable safetensors file: {exc}") from exc
        yield handles


def iter_handles(handles: Sequence[Any]) -> Iterator[tuple[str, torch.Tensor]]:
    for fh in handles:
        for name in fh.keys():
            yield name, fh.get_tensor(name)


def param_shapes(engine) -> dict[str, tuple[int, ...]] | None:
    """name -> shape of what `engine.update_weights` accepts (None: not an nn.Module engine)."""
    model = engine.model
    if not isinstance(model, torch.nn.Module):
        return None
    table = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for n, t in model.state_dict(keep_vars=True).items():  # tied aliases, buffers
        table.setdefault(n, tuple(t.shape))
    return table


def check_checkpoint(handles: Sequence[Any], shapes: dict[str, tuple[int, ...]] | None) -> int:
    """Read every tensor once; ValueError naming the first unknown name, wrong shape or
    non-finite tensor. Returns the number of tensors."""
    from baton.sync.verify import WRAPPER_PREFIXES

    count = 0
    for name, t in iter_handles(handles):
        count += 1
        if shapes is not None:
            key = name
            if key not in shapes:
                for prefix in WRAPPER_PREFIXES:
                    key = key.removeprefix(prefix)
            if key not in shapes:
                raise ValueError(f"unknown parameter {name!r}")
            if shapes[key] != tuple(t.shape):
                raise ValueError(f"{name!r} has shape {tuple(t.shape)} in the checkpoint, the model's is {shapes[key]}")
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{name!r} has {bad} non-finite values (NaN/Inf); checkpoint rejected")
    if count == 0:
        raise ValueError("the checkpoint holds no tensors")
    return count
