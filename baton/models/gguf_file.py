"""What baton reads and writes as GGUF (llama.cpp's one-file model format), and the checks
that come before either: the `gguf` extra is there, a file is a whole GGUF of an
architecture baton runs. Every failure is a ConfigError, one line, before anything is written.

    gguf = import_gguf()                 # the llama.cpp project's package (`pip install -e ".[gguf]"`)
    arch = check_gguf_file(path, key)    # "llama" | "qwen2" | ...; ConfigError otherwise
    spec = ARCHITECTURES[arch]           # how its tensors are named and laid out

The reading (`gguf_in.py`: a .gguf -> a cached HF directory) goes through transformers' GGUF
loader; the writing (`gguf_out.py`: `baton export --gguf`) through the package's writer and
tensor-name tables. No GGUF byte layout is written here by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTALL = 'pip install -e ".[gguf]"'
MAGIC = b"GGUF"


@dataclass(frozen=True)
class GgufArch:
    """One architecture both ways: its HF `model_type`, and whether llama.cpp stores the Q and
    K projections with its rotary halves interleaved (`LlamaModel.permute` in llama.cpp's
    convert_hf_to_gguf.py; transformers' loader undoes it on load)."""

    model_type: str
    permute_qk: bool = False


# The decoder-only families baton trains, generates with and round-trips (tests/models/test_gguf.py).
ARCHITECTURES: dict[str, GgufArch] = {
    "llama": GgufArch("llama", permute_qk=True),
    "qwen2": GgufArch("qwen2"),
}


def is_gguf_path(path: Any) -> bool:
    return isinstance(path, str) and path.lower().endswith(".gguf")


def import_gguf() -> Any:
    """The `gguf` module, or a ConfigError naming the extra to install."""
    from baton.config import ConfigError

    try:
        import gguf
    except ImportError:
        raise ConfigError(f"reading or writing GGUF needs the gguf package: {INSTALL}") from None
    return gguf


def unsupported(arch: str, what: str) -> str:
    return f"{what}: gguf architecture {arch!r} is not supported: baton reads {', '.join(ARCHITECTURES)}"


def check_gguf_file(path: str | Path, key: str = "model.path") -> str:
    """The architecture of GGUF file `path` (one of ARCHITECTURES); a ConfigError (one line)
    if it is missing, not GGUF, cut short or damaged, or of another architecture."""
    from baton.config import ConfigError

    gguf = import_gguf()
    p = Path(path)
    what = f"{key}={path}"
    if not p.is_file():
        raise ConfigError(f"{what}: no such file")
    with open(p, "rb") as f:
        if f.read(4) != MAGIC:
            raise ConfigError(f"{what}: not a GGUF file (it does not start with the GGUF magic bytes)")
    size = p.stat().st_size
    try:
        reader = gguf.GGUFReader(str(p))
        arch = str(reader.fields["general.architecture"].contents())
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as e:  # the reader's errors on a short file: reshape, index, struct, ...
        raise ConfigError(f"{what}: a truncated or damaged GGUF file ({size:,} bytes; "
                          f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
    if end > size:
        raise ConfigError(f"{what}: a truncated GGUF file: its tensors end at byte {end:,}, the file has {size:,}")
    if arch not in ARCHITECTURES:
        raise ConfigError(unsupported(arch, what))
    return arch
